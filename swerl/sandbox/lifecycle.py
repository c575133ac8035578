"""Who owns which container, and removing them when their owner goes away.

Every container is labelled with its run and its owner process, so that
- the harness removes its own on exceptions (context managers), SIGINT, SIGTERM and normal exit;
- `swerl sandbox reap` removes what a dead run left behind (kill -9, power loss), and nothing that
  a live run still uses.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import docker
import docker.errors

from swerl.files import atomic_write
from swerl.sandbox.errors import DockerUnavailable

LABEL_MANAGED = "swerl.managed"
LABEL_RUN = "swerl.run"
LABEL_PID = "swerl.pid"
LABEL_HOST = "swerl.host"
LABEL_CREATED = "swerl.created"
LABEL_EXPIRES = "swerl.expires"
"""Unix time after which the container is expired: any reaper removes it, whoever owns it."""

_DEFAULT_RUN_ID = f"run-{uuid.uuid4().hex[:10]}"
_live: dict[str, Any] = {}  # container id -> docker client that created it
_lock = threading.Lock()
_atexit_installed = False
_signals_installed = False


def default_run_id() -> str:
    """The run id of this process unless a caller names one (e.g. the training run's name)."""
    return os.environ.get("SWERL_RUN_ID", _DEFAULT_RUN_ID)


def owner_labels(run_id: str) -> dict[str, str]:
    return {
        LABEL_MANAGED: "1",
        LABEL_RUN: run_id,
        LABEL_PID: str(os.getpid()),
        LABEL_HOST: socket.gethostname(),
        LABEL_CREATED: str(int(time.time())),
    }


def expiry_labels(ttl_s: float | None) -> dict[str, str]:
    """The label that makes a container made now expire after `ttl_s` seconds (none for None)."""
    return {} if ttl_s is None else {LABEL_EXPIRES: str(int(time.time() + ttl_s))}


def docker_client(timeout: int = 120) -> Any:
    """A Docker SDK client, or DockerUnavailable saying how to start the daemon."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as e:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise DockerUnavailable(
            f"cannot reach the Docker daemon at {host} ({e}). Start it: `sudo systemctl start docker`, "
            "or `sudo dockerd &` where there is no systemd, or run scripts/setup.sh which installs and "
            "starts it; if the daemon runs elsewhere, set DOCKER_HOST."
        ) from e
    return client


def register(container_id: str, client: Any) -> None:
    with _lock:
        _live[container_id] = client
    install_handlers()


def unregister(container_id: str) -> None:
    with _lock:
        _live.pop(container_id, None)


def orphans_path() -> Path:
    """Where containers that could not be removed (the daemon was away) are recorded for later."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "swerl" / "orphaned-containers"


def record_orphan(container_id: str) -> None:
    """Note a container this process could not remove, so that the next sandbox start (of any swerl
    process on this machine) removes it; the reaper would spare it while its owner lives."""
    path = orphans_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(container_id + "\n")


def reap_orphans(client: Any) -> list[str]:
    """Remove the recorded orphans that can be removed now; the others stay recorded."""
    path = orphans_path()
    try:
        ids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []
    removed, left = [], []
    for cid in dict.fromkeys(ids):
        try:
            client.api.remove_container(cid, force=True)
            removed.append(cid)
        except docker.errors.NotFound:
            removed.append(cid)
        except Exception:
            left.append(cid)
    with _lock, contextlib.suppress(OSError):
        atomic_write(path, "".join(c + "\n" for c in left))
    return removed


def remove_all_live() -> int:
    """Remove every container this process still owns. Safe to call from a signal handler."""
    with _lock:
        items = list(_live.items())
        _live.clear()
    for cid, client in items:
        # already gone, or the daemon is gone: nothing more we can do
        with contextlib.suppress(Exception):
            client.api.remove_container(cid, force=True)
    return len(items)


def _on_signal(signum: int, frame: FrameType | None, previous: Any) -> None:
    remove_all_live()
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    elif signum == signal.SIGTERM:
        # Unwind instead of dying on the spot, so the program's own cleanup runs (`finally`, `with`: e.g.
        # the training loop stopping the inference server it launched); a second SIGTERM kills at once.
        signal.signal(signum, signal.SIG_DFL)
        raise SystemExit(128 + signum)
    else:
        # Default action: die by the same signal so the exit status tells the parent what happened.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_handlers() -> None:
    """Remove our containers on SIGINT / SIGTERM / exit; chains to handlers already installed.

    Signal handlers can only be installed from the main thread: sandboxes and pools call this in
    their constructors (normally on the main thread) as well as when a container is registered."""
    global _atexit_installed, _signals_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(remove_all_live)
    if _signals_installed or threading.current_thread() is not threading.main_thread():
        return
    _signals_installed = True
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        signal.signal(sig, lambda s, f, prev=previous: _on_signal(s, f, prev))


@dataclass(frozen=True)
class ReapedContainer:
    id: str
    name: str
    run_id: str
    reason: str


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(*, run_id: str | None = None, everything: bool = False, client: Any = None) -> list[ReapedContainer]:
    """Remove swerl containers whose owner is gone.

    Default: containers of this host whose owner process no longer exists, and expired ones (past their
    `swerl.expires` label, whoever owns them). `run_id`: every container of that run. `everything`: every
    swerl container, live runs included.
    """
    client = client or docker_client()
    filters = {"label": [f"{LABEL_MANAGED}=1"] + ([f"{LABEL_RUN}={run_id}"] if run_id else [])}
    reaped = []
    host = socket.gethostname()
    for c in client.containers.list(all=True, filters=filters):
        labels = c.labels
        if everything or run_id:
            reason = "requested"
        elif labels.get(LABEL_HOST) == host and not _pid_alive(int(labels.get(LABEL_PID, "0") or 0)):
            reason = f"owner process {labels.get(LABEL_PID)} is gone"
        elif labels.get(LABEL_EXPIRES, "").isdigit() and int(labels[LABEL_EXPIRES]) < time.time():
            reason = "expired"
        else:
            continue
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            continue
        reaped.append(ReapedContainer(c.id, c.name, labels.get(LABEL_RUN, ""), reason))
    return reaped
