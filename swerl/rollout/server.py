"""What the SGLang and vLLM engines share: inference servers over HTTP, launched as a child process
or attached to by URL — the process and its log, health polling, the HTTP client, and the topology
(workers, an optional router) with its failure rules.

Topology and failures (the rules `ServerConfig` documents):

- Generation goes to the router when there is one, else round-robin over the workers in rotation.
  Weight updates and cache calls go to every worker in rotation.
- Each request is retried on connection errors only (`retries` attempts, backoff doubling from
  `backoff_s`); an HTTP answer of any status and a timeout are never retried on the same server.
- A worker whose attempts all fail, or whose last `retries` requests all timed out, leaves the
  rotation for the rest of the run, with one warning line naming it and why. It is never asked
  again, not even for weight updates, so it cannot come back serving old weights; restart the run
  (it resumes from its checkpoint) to use it again.
- A generation that was on a worker leaving the rotation is retried once on another worker: a fresh
  sample of the same prompt, which the caller gets instead of the lost one (it is one call, one
  result: `generations` counts it once, `failovers` counts the retry). Failing there too is an
  EngineError for that call.
- A weight update or flush that loses a worker still succeeds on the rest. With a router it stops
  the run instead (EngineUnavailable): the router keeps its own list of workers and could send a
  revived worker requests with the old weights. Distributed (broadcast) updates need every rank of
  the group, so any lost worker stops them too.
- No worker left (or the router gone): EngineUnavailable, the one error after which the engine is
  done; each call after that raises it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from swerl.rollout.config import ServerConfig
from swerl.rollout.engine import EngineError, EngineTimeout, EngineUnavailable, check_n
from swerl.rollout.http import ConnectionFailed, HTTPClient, Response, ServerGone, check_auth, with_retries
from swerl.structs import Generation, SamplingParams

log = logging.getLogger("swerl.rollout")

T = TypeVar("T")


class ServerEngine:
    """Base of the HTTP engines; `config` is a `ServerConfig` (or a subclass of it). `router`: the URL
    generations go to instead of the workers (SGLang's router)."""

    server_name = "server"  # "SGLang", "vLLM": used in every message
    health_poll_s = 1.0
    close_wait_s = 60.0
    attach_refused_s = 3.0  # an attached URL that refuses connections this long is an error
    wait_note_s = 15.0  # a waiting line this often while a server starts

    def __init__(self, config: ServerConfig, *, process: subprocess.Popen[bytes] | None = None,
                 urls: tuple[str, ...] | None = None, log_path: Path | None = None, router: str = "") -> None:
        self.config = config
        self.urls = tuple(u.rstrip("/") for u in (urls or config.urls))  # the workers
        if not self.urls:
            raise ValueError(f"{type(self).__name__} needs at least one server URL")
        self.router = router.rstrip("/") or None
        self.process = process
        self.log_path = log_path
        self.weight_version = 0
        self.generations = 0  # generate calls answered (a call retried on another worker counts once)
        self.failovers = 0  # generate calls retried on another worker after theirs left the rotation
        self.left: dict[str, str] = {}  # worker -> why it left the rotation
        self._live = list(self.urls)
        self._next = 0
        self._timeouts = dict.fromkeys(self.urls, 0)  # timed-out requests in a row, per worker
        self._api_key = config.api_key or os.environ.get("SWERL_API_KEY", "")
        servers = len(self.urls) + (self.router is not None)
        self.http = HTTPClient(max_connections=config.concurrency + 2 * servers, api_key=self._api_key,
                               ca_cert=config.ca_cert)
        self.on_wait: Callable[[str], None] | None = None  # told while start() waits for the server

    @property
    def live(self) -> tuple[str, ...]:
        """The workers in rotation."""
        return tuple(self._live)

    @classmethod
    async def _start(cls, config: ServerConfig, command: list[str], *, log_dir: str | os.PathLike[str] | None,
                     env: Mapping[str, str] | None = None,
                     on_wait: Callable[[str], None] | None = None) -> Any:
        """Attach to `config.urls`, or launch `command` and wait until it is healthy. A launched server
        gets this process's environment + `env` (the engine's own variables) + `config.env`. `on_wait`
        gets a line now and then while the server is not healthy yet."""
        if config.urls:
            engine = cls(config)
        else:
            log_path = Path(log_dir or ".") / f"{cls.server_name.lower()}-{config.port}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log_file:
                # own session: close() can stop the server without touching ours
                proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True,
                                        env={**os.environ, **dict(env or {}), **dict(config.env)})
            engine = cls(config, process=proc, urls=(f"http://{config.host}:{config.port}",),
                         log_path=log_path)
        engine.on_wait = on_wait
        try:
            await engine.wait_healthy(config.startup_timeout_s)
        except BaseException:
            await engine.close()
            raise
        return engine

    async def wait_healthy(self, timeout_s: float) -> None:  # subclasses add their own checks
        deadline = time.monotonic() + timeout_s
        for url in self._servers():
            await self._wait_up(url, deadline, timeout_s)

    def _servers(self) -> tuple[str, ...]:
        """The workers, then the router (if any)."""
        return self.urls + ((self.router,) if self.router else ())

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
                                  f"before becoming healthy — its log ({self.log_path}) ends with:\n"
                                  f"{self._log_tail()}")
            try:
                if (await self.http.request(url, "GET", "/health", timeout=10)).status == 200:
                    return
            except EngineTimeout:
                pass  # a server busy starting: keep polling until the deadline
            except ConnectionFailed as e:
                if self.process is None and e.refused and time.monotonic() - t0 > self.attach_refused_s:
                    raise EngineUnavailable(
                        f"nothing listens at {url} (connection refused for {self.attach_refused_s:.0f} s) — "
                        f"start the {self.server_name} server there, or fix the URL") from e
            now = time.monotonic()
            if now > deadline:
                raise EngineError(f"{self.server_name} server {url} not healthy after {timeout_s:.0f} s — "
                                  "raise the start-up timeout or check the server"
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
        alone), then close the HTTP client; attached servers are left running. Idempotent."""
        proc, self.process = self.process, None
        try:
            if proc is not None:
                await asyncio.to_thread(stop_process_group, proc, self.close_wait_s)
        finally:
            await self.http.aclose()

    # ---- requests ---------------------------------------------------------------------------------

    async def _call(self, url: str, method: str, path: str, body: Any = None, *,
                    timeout: float | None = None) -> Response:
        """One request with retries on connection errors (ServerGone when they all fail); a 401 / 403 is
        an EngineError saying which key to set."""
        what = f"{self.server_name} {method} {url}{path}"
        resp = await with_retries(
            lambda: self.http.request(url, method, path, body,
                                      timeout=timeout or self.config.request_timeout_s),
            what=what, url=url, retries=self.config.retries, backoff_s=self.config.backoff_s)
        return check_auth(resp, what, key_sent=bool(self._api_key))

    async def health(self) -> dict[str, bool]:
        """Each server URL (workers, then the router) -> whether it answers /health with 200 right now."""
        async def one(url: str) -> bool:
            try:
                return (await self.http.request(url, "GET", "/health", timeout=30)).status == 200
            except (ConnectionFailed, EngineError):
                return False
        urls = self._servers()
        return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls)), strict=True))

    def _gone_error(self) -> EngineUnavailable:
        why = "; ".join(f"{u} ({r})" for u, r in self.left.items())
        return EngineUnavailable(f"no {self.server_name} server left: {why} — the run cannot go on; restart "
                                 "the servers and resume the run")

    def _leave(self, url: str, why: str) -> None:
        """Take `url` out of the rotation for good (one warning line)."""
        if url in self._live:
            self._live.remove(url)
            self.left[url] = why
            log.warning("%s worker %s left the rotation for the rest of the run (%d of %d left): %s",
                        self.server_name, url, len(self._live), len(self.urls), why)

    def _pick(self, avoid: tuple[str, ...] = ()) -> str:
        """The next worker in rotation (round-robin), other than `avoid` where possible."""
        if not self._live:
            raise self._gone_error()
        for _ in range(len(self._live)):
            url = self._live[self._next % len(self._live)]
            self._next += 1
            if url not in avoid:
                return url
        return url

    async def _generate_call(self, path: str, body: Any) -> tuple[str, Response]:
        """POST a generation request (to the router, or to a worker with the failover rules of the
        module docstring); (the URL that answered, its response)."""
        if self.router is not None:
            try:
                resp = await self._call(self.router, "POST", path, body)
            except ServerGone as e:
                raise EngineUnavailable(f"the {self.server_name} router at {self.router} is gone ({e}) — the "
                                        "run cannot go on; restart it and resume the run") from e
            self.generations += 1
            return self.router, resp
        tried: list[str] = []
        for attempt in range(2):
            url = self._pick(avoid=tuple(tried))
            if url in tried:  # only workers this call already lost: none to retry on
                break
            try:
                resp = await self._call(url, "POST", path, body)
            except ServerGone as e:
                self._leave(url, f"{path}: {e.reason}")
                tried.append(url)
                if attempt == 0 and self._live:
                    self.failovers += 1
                    log.info("%s %s was on %s: retried once on another worker", self.server_name, path, url)
                continue
            except EngineTimeout as e:
                self._timed_out(url, e)
                raise
            self._timeouts[url] = 0
            self.generations += 1
            return url, resp
        if not self._live:
            raise self._gone_error()
        raise EngineError(f"{self.server_name} {path} failed on {' and then on '.join(tried)}, which left "
                          "the rotation")

    def _timed_out(self, url: str, e: EngineTimeout) -> None:
        self._timeouts[url] += 1
        if self._timeouts[url] >= self.config.retries:
            self._leave(url, f"its last {self._timeouts[url]} requests timed out (last: {e})")

    async def _on_workers(self, what: str, one: Callable[[str], Awaitable[T]], *,
                          tolerate_loss: bool = True) -> dict[str, T]:
        """`one(url)` on every worker in rotation, concurrently; url -> result of those that answered.
        A worker that is gone (ServerGone) leaves the rotation when `tolerate_loss` and there is no
        router; otherwise that stops the run (EngineUnavailable). Any other error is raised once all
        have finished."""
        urls = list(self._live)
        if not urls:
            raise self._gone_error()
        results = await asyncio.gather(*(one(u) for u in urls), return_exceptions=True)
        out: dict[str, T] = {}
        errors: list[BaseException] = []
        for url, r in zip(urls, results, strict=True):
            if isinstance(r, ServerGone):
                if not tolerate_loss or self.router is not None:
                    reason = ("the router could still send it requests with the old weights"
                              if self.router is not None else "every worker must take part")
                    errors.insert(0, EngineUnavailable(
                        f"{what}: worker {url} is gone ({r.reason}); {reason}, so the run stops — restart "
                        "the worker and resume the run"))
                else:
                    self._leave(url, f"{what}: {r.reason}")
            elif isinstance(r, BaseException):
                errors.append(r)
            else:
                out[url] = r
        if errors:
            raise errors[0]
        if not self._live:
            raise self._gone_error()
        return out

    # ---- generation: subclasses implement `_generate` for their server's API ----------------------

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generation]:
        raise NotImplementedError

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return (await self._generate(prompt_ids, params, 1))[0]

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams,
                         n: int) -> tuple[Generation, ...]:
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
