"""The reusable sandbox harness: `from swerl.sandbox import DockerSandbox, SandboxSpec`.

Knows nothing of LLMs or RL; any agent can use it.
"""

from swerl.sandbox.base import Sandbox
from swerl.sandbox.docker_sandbox import DockerSandbox
from swerl.sandbox.errors import DockerUnavailable, ImageNotFound, SandboxDied, SandboxError
from swerl.structs import ExecResult, SandboxSpec

__all__ = [
    "DockerSandbox",
    "DockerUnavailable",
    "ExecResult",
    "ImageNotFound",
    "Sandbox",
    "SandboxDied",
    "SandboxError",
    "SandboxSpec",
]
