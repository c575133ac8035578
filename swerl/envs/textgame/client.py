"""The host side of the text-game line protocol: `SandboxTextGame` plays a game through
`python3 -m swerl.envs.textgame.server` inside a sandbox of the text-game image, and `open_game` picks
that or the in-process game.
"""

from __future__ import annotations

import json
import time
from typing import Any, Self

from swerl.envs.textgame.image import TEXTGAME_ROOT, TEXTGAME_USER
from swerl.envs.textgame.protocol import GAME_KINDS, TextGame, make_game, obs_from_dict
from swerl.sandbox.errors import SandboxError
from swerl.sandbox.session import ExecStream
from swerl.structs import GameObs


class TextGameError(RuntimeError):
    """The game refused a request (unknown game id, a step after the game ended, ...)."""


class GameServerDied(SandboxError):
    """The game server process in the sandbox is gone or stopped answering; start a fresh sandbox."""


class SandboxTextGame:
    """`TextGame` played by `python3 -m swerl.envs.textgame.server` inside a running `DockerSandbox`
    of the text-game image, spoken to over its own `docker exec` stdin/stdout (requests are JSON
    lines, so actions with quotes, newlines or any unicode travel unchanged). The server process
    lives as long as this object (`close()`, or the sandbox's removal); a server that died or stopped
    answering raises `GameServerDied` with its exit status and the end of its stderr.

    `timeout_s`: seconds one request may take (reserved keyword: no game argument may be named so)."""

    def __init__(self, sandbox: Any, kind: str, *, timeout_s: float = 120.0, **kwargs: Any) -> None:
        if kind not in GAME_KINDS:
            raise ValueError(f"unknown text-game kind {kind!r}; known kinds: {', '.join(sorted(GAME_KINDS))}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        container = getattr(sandbox, "container", None)
        if container is None:
            raise SandboxError("SandboxTextGame needs a started DockerSandbox (use `with DockerSandbox(spec) "
                               "as sb:`)")
        self.kind = kind
        self.timeout_s = timeout_s
        self._label = f"{kind} game server in sandbox {container.id[:12]}"
        self._api = container.client.api
        self._closed = False
        self._dead = ""
        cmd = ["python3", "-m", "swerl.envs.textgame.server", kind, json.dumps(kwargs)]
        try:
            self._exec_id = self._api.exec_create(
                container.id, cmd, stdin=True, stdout=True, stderr=True, tty=False, user=TEXTGAME_USER,
                workdir=TEXTGAME_ROOT,
                environment={"PYTHONPATH": TEXTGAME_ROOT, "PYTHONUNBUFFERED": "1",
                             "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"})["Id"]
            sock = self._api.exec_start(self._exec_id, socket=True, demux=False)
        except Exception as e:
            raise GameServerDied(f"could not start the {self._label}: {e}") from e
        self._stream = ExecStream(sock, err_limit=65536)
        # Loading a game's libraries can take seconds (TextWorld's grammar parser); then it says ready.
        ready = self._read_reply(time.monotonic() + max(timeout_s, 60.0))
        if not ready.get("ok"):
            self._shutdown()
            raise GameServerDied(f"the {self._label} could not start: {ready.get('error')}"
                                 f"{self._stderr_note()}")

    # ---- wire ----------------------------------------------------------------------------------
    def _stderr_note(self) -> str:
        tail = self._stream.err[-2000:].decode("utf-8", "replace").strip()
        return f"\n--- server stderr (end) ---\n{tail}" if tail else ""

    def _died(self, what: str) -> GameServerDied:
        status = ""
        try:
            info = self._api.exec_inspect(self._exec_id)
            if not info.get("Running"):
                status = f" (exit status {info.get('ExitCode')})"
        except Exception as e:  # the container itself is gone
            status = f" (the sandbox is gone: {e})"
        self._dead = f"{what}{status}"
        self._shutdown()
        return GameServerDied(f"the {self._label} {self._dead}; start a fresh sandbox{self._stderr_note()}")

    def _pump(self, deadline: float) -> None:
        try:
            self._stream.pump(deadline)
        except TimeoutError:
            raise self._died(f"did not answer within {self.timeout_s:g} s") from None
        except EOFError:
            raise self._died("exited") from None

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._stream.out:
            self._pump(deadline)
        line, _, self._stream.out = self._stream.out.partition(b"\n")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise self._died(f"wrote a line that is not protocol JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            raise self._died(f"wrote a non-object reply: {line[:200]!r}")
        return reply

    def _request(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise TextGameError(f"the {self._label} was closed")
        if self._dead:
            raise GameServerDied(f"the {self._label} {self._dead} earlier; start a fresh sandbox")
        data = (json.dumps(payload, ensure_ascii=True) + "\n").encode()
        try:
            self._stream.send(data)
        except OSError:
            raise self._died("stopped reading its input") from None
        reply = self._read_reply(time.monotonic() + self.timeout_s)
        if not reply.get("ok"):
            raise TextGameError(f"{self.kind}: {reply.get('error', 'unknown error')}")
        return reply

    # ---- TextGame ------------------------------------------------------------------------------
    def reset(self, game_id: str) -> GameObs:
        return obs_from_dict(self._request({"op": "reset", "game_id": game_id})["obs"])

    def step(self, action: str) -> GameObs:
        return obs_from_dict(self._request({"op": "step", "action": action})["obs"])

    def _shutdown(self) -> None:
        self._stream.close()

    def close(self) -> None:
        if self._closed:
            return
        if not self._dead:
            try:
                self._stream.send(b'{"op": "close"}\n')
                self._read_reply(time.monotonic() + 5.0)
            except (OSError, SandboxError):
                pass  # it is going away either way
        self._closed = True
        self._shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_game(kind: str, sandbox: Any = None, **kwargs: Any) -> TextGame:
    """The game of `kind` in `sandbox` (its server, over the line protocol), or in this process when
    `sandbox` is None: what an episode factory calls with the sandbox the runner gave it."""
    return SandboxTextGame(sandbox, kind, **kwargs) if sandbox is not None else make_game(kind, **kwargs)
