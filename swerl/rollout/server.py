"""What the SGLang and vLLM engines share: inference servers over HTTP, launched as a child process
or attached to by URL — the process and its log, health polling, retried calls, round-robin."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from swerl.rollout.engine import EngineError, EngineUnavailable, check_n
from swerl.rollout.http import ConnectionFailed, request, with_retries
from swerl.structs import Generation, SamplingParams, ServerConfig


class ServerEngine:
    """Base of the HTTP engines; `config` is a `ServerConfig` (or a subclass of it)."""

    server_name = "server"  # "SGLang", "vLLM": used in every message
    health_poll_s = 1.0
    close_wait_s = 60.0
    attach_refused_s = 3.0  # an attached URL that refuses connections this long is an error
    wait_note_s = 15.0  # a waiting line this often while a server starts

    def __init__(self, config: ServerConfig, *, process: subprocess.Popen[bytes] | None = None,
                 urls: tuple[str, ...] | None = None, log_path: Path | None = None) -> None:
        self.config = config
        self.urls = tuple(u.rstrip("/") for u in (urls or config.urls))
        if not self.urls:
            raise ValueError(f"{type(self).__name__} needs at least one server URL")
        self.process = process
        self.log_path = log_path
        self.weight_version = 0
        self._next = itertools.count()
        self.on_wait: Callable[[str], None] | None = None  # told while start() waits for the server

    @classmethod
    async def _start(cls, config: ServerConfig, command: list[str], *, log_dir: str | os.PathLike[str] | None,
                     env: Mapping[str, str] | None = None, on_wait: Callable[[str], None] | None = None) -> Any:
        """Attach to `config.urls`, or launch `command` and wait until it is healthy. A launched server
        gets this process's environment + `env` (the engine's own variables) + `config.env`. `on_wait`
        gets a line now and then while the server is not healthy yet."""
        if config.urls:
            engine = cls(config)
        else:
            log_path = Path(log_dir or ".") / f"{cls.server_name.lower()}-{config.port}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                # own session: close() can stop the server without touching ours
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, **dict(env or {}), **dict(config.env)})
            engine = cls(config, process=proc, urls=(f"http://{config.host}:{config.port}",), log_path=log_path)
        engine.on_wait = on_wait
        try:
            await engine.wait_healthy(config.startup_timeout_s)
        except BaseException:
            await engine.close()
            raise
        return engine

    async def wait_healthy(self, timeout_s: float) -> None:  # subclasses add their own checks
        deadline = time.monotonic() + timeout_s
        for url in self.urls:
            await self._wait_up(url, deadline, timeout_s)

    async def _wait_up(self, url: str, deadline: float, timeout_s: float) -> None:
        """Poll `url`/health until it answers 200; a launched server that exits is an error at once.

        An attached server (no process of ours) where nothing listens fails after `attach_refused_s`:
        a server that is starting accepts connections (and answers 503) long before it is healthy, so a
        refused connection means a wrong URL or a server that is not running, and waiting the whole
        start-up timeout for it would only hide the mistake."""
        t0 = time.monotonic()
        next_note = t0 + self.wait_note_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise EngineError(f"the {self.server_name} server exited with code {self.process.returncode} "
                                  f"before becoming healthy — its log ({self.log_path}) ends with:\n{self._log_tail()}")
            try:
                if (await request(url, "GET", "/health", timeout=10)).status == 200:
                    return
            except ConnectionFailed as e:
                if self.process is None and e.refused and time.monotonic() - t0 > self.attach_refused_s:
                    raise EngineUnavailable(
                        f"nothing listens at {url} (connection refused for {self.attach_refused_s:.0f} s) — start "
                        f"the {self.server_name} server there, or fix the URL") from e
            now = time.monotonic()
            if now > deadline:
                raise EngineError(f"{self.server_name} server {url} not healthy after {timeout_s:.0f} s — raise the "
                                  "start-up timeout or check the server"
                                  + (f"; its log ({self.log_path}) ends with:\n{self._log_tail()}"
                                     if self.log_path else ""))
            if self.on_wait is not None and now >= next_note:
                self.on_wait(f"waiting for the {self.server_name} server at {url} to become healthy "
                             f"({now - t0:.0f} s of at most {timeout_s:.0f} s)")
                next_note = now + self.wait_note_s
            await asyncio.sleep(self.health_poll_s)

    def _log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def close(self) -> None:
        """Stop the launched server (if any) with every process it started (its own session: vLLM's
        EngineCore and workers, SGLang's scheduler and detokenizer outlive a signal to the API server
        alone); attached servers are left running."""
        proc, self.process = self.process, None
        if proc is not None:
            await asyncio.to_thread(stop_process_group, proc, self.close_wait_s)

    async def _call(self, url: str, method: str, path: str, body: Any = None) -> Any:
        return await with_retries(lambda: request(url, method, path, body, timeout=self.config.request_timeout_s),
                                  what=f"{self.server_name} {method} {url}{path}", retries=self.config.retries,
                                  backoff_s=self.config.backoff_s)

    def _pick(self) -> str:
        return self.urls[next(self._next) % len(self.urls)]

    # ---- generation: subclasses implement `_generate` for their server's API ----------------------

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generation]:
        raise NotImplementedError

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return (await self._generate(prompt_ids, params, 1))[0]

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams, n: int) -> tuple[Generation, ...]:
        check_n(n)
        return tuple(await self._generate(prompt_ids, params, n))


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running. Zombies do not count: an orphaned child that
    has exited waits for init to reap it, and waiting for that would only stall `close()`."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel (zombies included)
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def stop_process_group(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    """SIGTERM to the process group `proc` leads (started with `start_new_session`); SIGKILL to whatever
    of the group still runs after `wait_s`; returns once the leader is reaped and nothing of the group
    runs (or a few seconds after the SIGKILL)."""
    import signal

    def group(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stopped(within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return True
            time.sleep(0.05)
        return False

    group(signal.SIGTERM)
    if stopped(wait_s):
        return
    group(signal.SIGKILL)  # children that ignored SIGTERM, or outlived their parent
    stopped(5.0)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
