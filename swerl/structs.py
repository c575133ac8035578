"""Frozen dataclasses that cross module borders.

Nothing here imports from the rest of swerl: every module can depend on these types, and these
types depend on nothing but the standard library. Field docstrings double as `--help` text where a
struct is also a config section (see `swerl.config`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command in a sandbox. A value, never an exception: a command that fails,
    times out or is OOM-killed is still a result the agent observes."""

    exit_code: int
    """Exit status of the command (128 + signal number when it was killed by a signal)."""
    output: str
    """Combined stdout and stderr, decoded as UTF-8 (invalid bytes replaced), capped: when
    `output_bytes` exceeds what is shown, the middle is replaced by a marker saying how much was cut."""
    duration_s: float
    """Wall-clock seconds from sending the command to receiving its result."""
    timed_out: bool = False
    """The command hit its timeout and was killed."""
    oom: bool = False
    """A process of the command was killed by the out-of-memory killer of the sandbox's cgroup."""
    output_bytes: int = 0
    """Total bytes the command wrote (at least this many if `output_limit_hit`)."""
    output_limit_hit: bool = False
    """The command wrote more than the sandbox keeps per command; its further writes failed."""
    note: str = ""
    """Something the harness did that the caller should know (e.g. the shell was restarted)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        """Part of the output was cut before it reached the caller."""
        return self.output_limit_hit or len(self.output.encode("utf-8", "replace")) < self.output_bytes


@dataclass(frozen=True)
class SandboxSpec:
    """How to start a sandbox: image, limits and safety settings."""

    image: str = "swerl-base:latest"
    """Docker image to run (a task image for a SWE task, the base image otherwise)."""
    workdir: str = "/testbed"
    """Directory the shell session starts in (and the repository whose `diff()` is taken)."""
    user: str = "auto"
    """User the commands run as: `auto` uses the image's `swerl.user` label (non-root in swerl's
    images) and root for images without one; or a name / uid[:gid]."""
    network: str = "none"
    """Docker network mode. `none` (no network at all) unless a task really needs more."""
    memory: str = "2g"
    """Memory limit (docker syntax, e.g. 512m, 4g); swap is disabled so the limit is real."""
    cpus: float = 1.0
    """CPU quota in cores."""
    pids: int = 256
    """Maximum number of processes and threads in the container (stops fork bombs)."""
    disk: str | None = None
    """Writable-layer size limit (needs overlay2 on xfs with pquota); None = unlimited."""
    output_limit: int = 50_000
    """Bytes of a command's output returned to the caller; past it the middle is cut with a marker."""
    output_spool: str = "64m"
    """Bytes a single command may write in total; writes past it fail (ENOSPC), so a flood
    can neither fill the host's memory nor the container's disk."""
    default_timeout: float = 120.0
    """Seconds a command may run when `run()` is not given a timeout."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the session, as (name, value) pairs."""

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("SandboxSpec.image is empty: name a Docker image (e.g. swerl-base:latest)")
        if not self.workdir.startswith("/"):
            raise ValueError(f"SandboxSpec.workdir must be an absolute path, got {self.workdir!r}")
        if self.cpus <= 0:
            raise ValueError(f"SandboxSpec.cpus must be > 0, got {self.cpus}")
        if self.pids < 16:
            raise ValueError(f"SandboxSpec.pids must be >= 16 (the shell needs some), got {self.pids}")
        if self.output_limit < 256:
            raise ValueError(f"SandboxSpec.output_limit must be >= 256 bytes, got {self.output_limit}")
        if self.default_timeout <= 0:
            raise ValueError(f"SandboxSpec.default_timeout must be > 0, got {self.default_timeout}")
