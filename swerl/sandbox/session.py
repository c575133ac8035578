"""A persistent bash session inside a container, spoken to over one `docker exec` attach socket.

Why: a `docker exec` per command costs ~60 ms; writing a line to a shell that is already running
costs a few ms, and the session keeps `cd`, `export`, shell variables, functions and aliases between
tool calls like a terminal does. The protocol (the whole of it is in `sandbox/session_init.sh`):

  host → shell:  __swerl_run $'. CHILD; eval $\\'CMD\\'' S
                 #N
  shell → host:  __SWERL_BEGIN_N\\n<first output_limit bytes of OUT>\\n
                 __SWERL_DONE_N rc ooms cwd__SWERL_END_N\\n

Unforgeable: the command runs in a child process of the harness shell, as another user (the
harness is root) and with no descriptor to the host, and the harness, which never runs model code,
reads the fresh nonce N from its input only after the child exited. Nothing the command can read
holds N, nor can it write where the markers go, so its exit status, output and end marker are what
the harness saw. S counts the signals the host has sent the sandbox's supervisor: the shell starts the
command once they have all been handled, so a sweep still running cannot kill it.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import select
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.sandbox.errors import SandboxDied, SandboxError

ASSETS = Path(__file__).resolve().parents[2] / "sandbox"
RUN_DIR = "/run/swerl"  # tmpfs, size = SandboxSpec.output_spool
STAGE_DIR = "/.swerl-stage"  # the user's, in root's /: files write_file puts in place as the user
HARNESS_DIR = f"{RUN_DIR}/h"  # root-owned: the command's output, directory and shell state
OUT_FILE = f"{HARNESS_DIR}/out"
CHILD_SCRIPT = f"{HARNESS_DIR}/child.sh"


def asset(name: str) -> str:
    path = ASSETS / name
    if not path.is_file():
        raise SandboxError(
            f"{path} is missing: swerl must be run from its source checkout (pip install -e .)"
        )
    return path.read_text()


def bash_quote(cmd: str) -> str:
    """Quote `cmd` as a bash ANSI-C string $'...' that survives being sent as one input line."""
    if "\x00" in cmd:
        raise ValueError("command contains a NUL byte, which bash cannot pass; remove it")
    out = []
    for ch in cmd:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


@dataclass(frozen=True)
class RawResult:
    exit_code: int
    output: bytes
    oom_kills: int
    cwd: str


class ExecStream:
    """The attach socket of a `docker exec` started with stdin open and no tty: bytes go in, and
    Docker's multiplexed frames come out (1 byte stream id, 3 pad, 4 bytes big-endian length),
    demultiplexed into `out` (stdout, for the caller to consume) and `err` (the last `err_limit` bytes
    of stderr). Docker forwards the two pipes independently, so their relative order is not kept."""

    def __init__(self, sock: Any, *, err_limit: int) -> None:
        # docker-py wraps the upgraded connection; the raw socket has the lower latency
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.sock.setblocking(True)
        self.out = b""
        self.err = b""
        self._raw = b""  # frame bytes not yet decoded
        self._err_limit = err_limit

    def send(self, data: bytes) -> None:
        """Write to the process's stdin (OSError when it is gone)."""
        self.sock.sendall(data)

    def pump(self, deadline: float) -> None:
        """Read one chunk into `out` / `err`: TimeoutError when nothing came by `deadline`, EOFError
        when the process closed its output."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        ready, _, _ = select.select([self.sock], [], [], remaining)
        if not ready:
            raise TimeoutError
        try:
            chunk = self.sock.recv(1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            raise EOFError
        self._raw += chunk
        while len(self._raw) >= 8:
            (length,) = struct.unpack(">I", self._raw[4:8])
            if len(self._raw) < 8 + length:
                break
            payload = self._raw[8 : 8 + length]
            if self._raw[0] == 2:
                self.err = (self.err + payload)[-self._err_limit :]
            else:
                self.out += payload
            self._raw = self._raw[8 + length :]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class ShellSession:
    """One bash process in a container. Not thread-safe: one command at a time."""

    def __init__(self, api: Any, container_id: str, *, user: str, workdir: str, env: dict[str, str],
                 output_limit: int, signals: int = 0) -> None:
        self._api = api
        self.container_id = container_id
        self.output_limit = output_limit
        exec_env = {**env, "SWERL_RUN": RUN_DIR, "SWERL_STAGE": STAGE_DIR, "SWERL_CAP": str(output_limit),
                    "SWERL_USER": user, "SWERL_SIGNALS": str(signals)}
        exec_id = api.exec_create(
            container_id, ["bash", "--noprofile", "--norc"], stdin=True, stdout=True, stderr=True,
            tty=False, user="root", workdir=workdir, environment=exec_env,
        )["Id"]
        # Only stdout carries the protocol (markers on fd 9 = stdout, command output via the OUT file).
        # The shell's stderr holds nothing but what bash says before session_init silences it, and it
        # can arrive after later stdout: the stream keeps it apart (the last 4 KiB, for diagnostics).
        self._stream = ExecStream(api.exec_start(exec_id, socket=True, demux=False), err_limit=4096)
        self.alive = True
        self.pid = -1
        init = asset("session_init.sh") + '\necho "__SWERL_READY_$$ $__swerl_uid $__swerl_gid"\n'
        self._send(init.encode())
        try:
            m = self._read_until(re.compile(rb"__SWERL_FAIL_\d+ ([^\n]*)\n|__SWERL_READY_(\d+) (\d+) "
                                            rb"(\d+)\n"),
                                 time.monotonic() + 30)
        except TimeoutError:
            raise SandboxError(
                f"the shell in container {container_id[:12]} did not start within 30 s; "
                "is the image's bash working? (try: docker run --rm IMAGE bash -c true)"
            ) from None
        if m.group(1) is not None:
            self.close()
            raise SandboxError(f"cannot start a shell in container {container_id[:12]}: "
                               f"{m.group(1).decode(errors='replace')}")
        self.pid, self.uid, self.gid = (int(g) for g in m.groups()[1:])
        self._stream.out = b""

    # ---- wire --------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self._stream.send(data)
        except OSError as e:
            self.alive = False
            raise SandboxDied(f"the shell session in container {self.container_id[:12]} is gone ({e})") from e

    def _read_until(self, pattern: re.Pattern[bytes], deadline: float) -> re.Match[bytes]:
        """The first match of `pattern` in the shell's output; TimeoutError at `deadline`."""
        start = 0
        while True:
            m = pattern.search(self._stream.out, start)
            if m:
                return m
            # Only the tail can hold a marker that is still incomplete: don't rescan the whole buffer.
            start = max(0, len(self._stream.out) - 512)
            try:
                self._stream.pump(deadline)
            except EOFError:
                self.alive = False
                raise SandboxDied(
                    f"the shell in container {self.container_id[:12]} closed its output "
                    f"(container stopped or killed from outside?)"
                ) from None

    # ---- commands ----------------------------------------------------------------------------
    def send_command(self, cmd: str, signals: int = 0) -> str:
        """Start `cmd` once the supervisor has handled the first `signals` signals the host sent it."""
        if not self.alive:
            raise SandboxDied("the shell session is closed")
        nonce = secrets.token_hex(16)
        script = f". {CHILD_SCRIPT}; eval {bash_quote(cmd)}"
        # the nonce line is read by __swerl_finish once the command's process has exited
        line = f"__swerl_run {bash_quote(script)} {int(signals)}\n#{nonce}\n"
        self._send(line.encode())
        return nonce

    def wait_result(self, nonce: str, deadline: float) -> RawResult:
        """Wait for the command's end marker; raises TimeoutError at the deadline."""
        n = nonce.encode()
        end = re.compile(rb"\n__SWERL_DONE_" + n + rb" (-?\d+) (\d+) (.*?)__SWERL_END_" + n + rb"\n", re.S)
        m = self._read_until(end, deadline)
        begin = b"__SWERL_BEGIN_" + n + b"\n"
        out = self._stream.out
        b = out.rfind(begin, 0, m.start() + 1)
        if b < 0:
            raise SandboxError(f"protocol error: end marker of command {nonce} without its begin marker")
        output = out[b + len(begin) : m.start()]
        self._stream.out = out[m.end() :]
        return RawResult(exit_code=int(m.group(1)), output=output, oom_kills=int(m.group(2)),
                         cwd=m.group(3).decode("utf-8", "replace"))

    def send_internal(self, cmd: str, signals: int = 0) -> str:
        """A harness command (a fresh shell as the command's user, without the command's state):
        output straight to the host, the command-output file left alone."""
        nonce = secrets.token_hex(16)
        self._send(f"__swerl_internal {nonce} {bash_quote(cmd)} {int(signals)}\n".encode())
        return nonce

    def run(self, cmd: str, timeout: float) -> RawResult:
        nonce = self.send_command(cmd)
        return self.wait_result(nonce, time.monotonic() + timeout)

    def close(self) -> None:
        self.alive = False
        self._stream.close()
