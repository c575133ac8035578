"""The Sandbox interface: what an agent (any agent, not only swerl's) can do in an isolated box."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Self

from swerl.structs import ExecResult


class Sandbox(ABC):
    """An isolated machine with a persistent shell.

    Lifecycle is explicit: `with DockerSandbox(spec) as sb: ...` starts it and always removes it.
    Commands return `ExecResult` values whatever happens to the command; exceptions mean the
    harness itself failed (see `swerl.sandbox.errors`).
    """

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def close(self) -> None:
        """Stop and remove everything the sandbox created. Idempotent."""

    @abstractmethod
    def run(self, cmd: str, timeout: float | None = None) -> ExecResult:
        """Run a bash command line in the persistent session (cwd and environment persist)."""

    @abstractmethod
    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The bytes of a file (absolute path). FileNotFoundError / IsADirectoryError as usual."""

    @abstractmethod
    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace a file (absolute path), creating parent directories."""

    @abstractmethod
    def upload(self, src: str | Path, dest: str) -> None:
        """Copy a host file or directory tree into the sandbox at `dest` (a directory)."""

    @abstractmethod
    def diff(self, base: str | None = None) -> str:
        """`git diff --binary` of the working tree (new files included) against `base`,
        default the commit checked out when the sandbox started."""

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str:
        return self.read_file(path, max_bytes=max_bytes).decode("utf-8", "replace")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
