"""Exceptions of the sandbox harness.

Commands that fail are *results* (`ExecResult`), not exceptions. These are raised only when the
harness itself cannot do its job, and each message says what to do about it.
"""


class SandboxError(RuntimeError):
    """The sandbox harness failed (not the command inside it)."""


class DockerUnavailable(SandboxError):
    """The Docker daemon cannot be reached."""


class ImageNotFound(SandboxError):
    """The sandbox image does not exist locally and cannot be pulled."""


class SandboxDied(SandboxError):
    """The container went away (killed from outside, daemon restarted) while in use."""
