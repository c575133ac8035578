"""DockerSandbox: the Sandbox interface on a Docker engine, through the Docker SDK for Python."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, Self

import docker.errors

from swerl.sandbox import lifecycle
from swerl.sandbox.base import Sandbox
from swerl.sandbox.diskwatch import DiskWatch
from swerl.sandbox.errors import ImageNotFound, SandboxDied, SandboxError
from swerl.sandbox.session import OUT_FILE, RUN_DIR, STAGE_DIR, RawResult, ShellSession, asset
from swerl.structs import ExecResult, SandboxSpec, size_bytes

log = logging.getLogger(__name__)

# Docker's default capabilities minus the ones a coding agent never needs and an attacker would like.
_CAP_DROP = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT", "SETFCAP", "NET_BIND_SERVICE"]
_KILL_GRACE_S = 3.0
MAX_FILE_BYTES = 256 * 1024 * 1024


MAX_COMMAND_BYTES = 1024 * 1024
"""Largest command line `run()` sends (the shell reads it whole; bigger input belongs in a file)."""
MAX_PATH_BYTES = 4096
"""Longest path (PATH_MAX); each component at most 255 bytes (NAME_MAX)."""


def _text(value: str, what: str, limit: int) -> bytes:
    """`value` as the UTF-8 bytes the container gets; ValueError for what no shell or kernel takes."""
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character (\\x00), which no command line or path can hold")
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not valid Unicode text (a lone surrogate at index {e.start})") from None
    if len(data) > limit:
        raise ValueError(f"{what} is {len(data)} bytes, over the limit of {limit}")
    return data


def _abs(path: str, what: str = "path") -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{what} must be absolute inside the sandbox, got {path!r}")
    _text(path, what, MAX_PATH_BYTES)
    long = [c for c in path.split("/") if len(c.encode()) > 255]
    if long:
        raise ValueError(f"{what} has a component of {len(long[0].encode())} bytes, over the limit of 255")
    return str(PurePosixPath(path))


class DockerSandbox(Sandbox):
    """A container with a persistent bash session.

        with DockerSandbox(SandboxSpec(image="swerl-base:latest")) as sb:
            sb.run("cd /tmp && echo hi > x")
            sb.run("cat x").output   # 'hi\\n'
    """

    def __init__(self, spec: SandboxSpec | None = None, *, run_id: str | None = None,
                 client: Any = None, base_commit: str | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.spec = spec or SandboxSpec()
        self.run_id = run_id or lifecycle.default_run_id()
        self._client = client
        self._extra_labels = labels or {}
        self.base_commit = base_commit
        self.container: Any = None
        self._session: ShellSession | None = None
        self._cwd = self.spec.workdir
        self._user = "root"
        self._dead_reason = ""
        self.closed = False
        self._upper: str | None = None  # the writable layer on this host, watched for disk_limit
        # signals sent to the supervisor (DiskWatch sends from its own thread): every command waits
        # until they have been handled, so a sweep still running cannot kill it
        self._signals = 0
        self._signals_lock = threading.Lock()
        # a close from another thread (a pool whose acquirer was cancelled) may land while `start` is
        # creating the container: whichever of the two comes second removes it
        self._life_lock = threading.Lock()
        lifecycle.install_handlers()

    # ---- lifecycle ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.container.id if self.container is not None else ""

    @property
    def client(self) -> Any:
        """The Docker client of the daemon the sandbox lives on (None before `start` without one given)."""
        return self._client

    def start(self) -> Self:
        if self.container is not None:
            return self
        spec = self.spec
        self._client = self._client or lifecycle.docker_client()
        try:
            image = self._client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            image = self._pull(spec.image)
        self._user = self._resolve_user(image)
        # Only the output spool is a tmpfs: the archive API behind read_file / write_file cannot see
        # into tmpfs mounts, so everything the agent may touch stays on the writable layer.
        tmpfs = {RUN_DIR: f"size={spec.output_spool},mode=1777"}
        kwargs: dict[str, Any] = dict(
            command=["bash", "-c", asset("supervisor.sh")],
            detach=True,
            init=True,  # docker-init reaps orphans; the supervisor under it never forks after start
            user="root",  # the supervisor must be able to kill whatever the session started
            working_dir="/",
            network_mode=spec.network,
            mem_limit=spec.memory,
            memswap_limit=spec.memory,
            nano_cpus=int(spec.cpus * 1e9),
            pids_limit=spec.pids,
            tmpfs=tmpfs,
            labels={**lifecycle.owner_labels(self.run_id), **self._extra_labels},
            security_opt=["no-new-privileges"],
            cap_drop=_CAP_DROP,
            environment={"SWERL_RUN": RUN_DIR},
            stop_signal="SIGKILL",
        )
        if spec.disk:
            kwargs["storage_opt"] = {"size": spec.disk}
        lifecycle.reap_orphans(self._client)  # containers an earlier close() could not remove
        try:
            container = self._client.containers.create(spec.image, **kwargs)
        except docker.errors.APIError as e:
            if spec.disk and "storage-opt" in str(e):
                raise SandboxError(
                    f"the Docker storage driver here cannot limit the writable layer ({e}); "
                    "set SandboxSpec.disk=None, or run the daemon on overlay2 over xfs with pquota"
                ) from e
            raise SandboxError(f"could not create a container from {spec.image}: {e}") from e
        with self._life_lock:
            closed = self.closed
            if not closed:
                self.container = container
        if closed:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
            raise SandboxError("the sandbox was closed while it was starting")
        lifecycle.register(self.container.id, self._client)
        try:
            self.container.start()
            self._upper = self._upper_dir() if spec.disk_limit else None
            self._session = self._new_session(spec.workdir)
            if self.base_commit is None:
                self.base_commit = self._head_commit(spec.workdir)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        with self._life_lock:
            if self.closed:
                return
            self.closed = True
        if self._session is not None:
            self._session.close()
            self._session = None
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    lifecycle.record_orphan(self.container.id)
                    raise SandboxError(f"could not remove sandbox {self.id[:12]} ({e}); recorded for removal "
                                       "by the next sandbox start (or `swerl sandbox reap`)") from e
            except Exception as e:  # the daemon is away (a connection error): the container outlives us
                lifecycle.record_orphan(self.container.id)
                log.warning("sandbox %s: the Docker daemon could not be reached to remove it (%s); it is "
                            "recorded and the next sandbox start removes it", self.id[:12], e)
            finally:
                lifecycle.unregister(self.container.id)

    def _pull(self, image: str) -> Any:
        try:
            return self._client.images.pull(image)
        except docker.errors.DockerException as e:
            hint = (
                "build it with `swerl sandbox build-base`"
                if image.startswith("swerl-base")
                else "build it (`swerl sandbox build-base`, or the task's image recipe) or `docker load` it"
            )
            raise ImageNotFound(f"image {image!r} is not on this machine and cannot be pulled ({e}); "
                                f"{hint}") from e

    def _resolve_user(self, image: Any) -> str:
        if self.spec.user != "auto":
            return self.spec.user
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        return labels.get("swerl.user") or "root"

    def _new_session(self, workdir: str) -> ShellSession:
        env = {"HOME": "/tmp" if self._user not in ("root", "0") else "/root", **dict(self.spec.env)}
        try:
            return ShellSession(self._client.api, self.container.id, user=self._user, workdir=workdir,
                                env=env, output_limit=self.spec.output_limit, signals=self._signals)
        except (docker.errors.APIError, SandboxDied) as e:
            raise self._died(f"could not start a shell ({e})") from e

    def _died(self, what: str) -> SandboxError:
        """Why the sandbox is unusable, as an exception whose message says what to do."""
        try:
            for _ in range(10):  # a killed container can look "running" for a moment after its shell died
                self.container.reload()
                state = self.container.attrs["State"]
                status = state.get("Status")
                if status != "running":
                    break
                time.sleep(0.05)
            detail = f"container status {status!r}, exit code {state.get('ExitCode')}"
            if state.get("OOMKilled"):
                detail += ", OOM-killed"
            if status == "running":
                return SandboxError(f"sandbox {self.id[:12]}: {what}")
        except docker.errors.NotFound:
            detail = "container was removed"
        except docker.errors.DockerException as e:
            detail = f"Docker daemon unreachable: {e}"
        self._dead_reason = f"{what}; {detail}"
        return SandboxDied(
            f"sandbox {self.id[:12]} died ({self._dead_reason}). Close it and start a fresh one "
            "(SandboxPool.acquire does)."
        )

    def _upper_dir(self) -> str | None:
        """The host directory of the container's writable layer (overlay2), when this host can read it."""
        try:
            data = self._client.api.inspect_container(self.id).get("GraphDriver", {}).get("Data") or {}
        except docker.errors.DockerException:
            return None
        upper = data.get("UpperDir")
        if upper and os.path.isdir(upper) and os.access(upper, os.R_OK | os.X_OK):
            return upper
        log.warning("sandbox %s: its writable layer is not readable on this host; disk_limit is not watched",
                    self.id[:12])
        return None

    def _raise_if_paused(self) -> None:
        """A paused container (`docker pause`) runs nothing and takes no signal: say so."""
        try:
            status = self._client.api.inspect_container(self.id)["State"]["Status"]
        except docker.errors.DockerException:
            return
        if status == "paused":
            raise SandboxError(f"sandbox {self.id[:12]} is paused (docker pause): it cannot run commands — "
                               "unpause it (`docker unpause`) or close it")

    def _signal(self, sig: str) -> None:
        try:
            with self._signals_lock:
                self._signals += 1
                self.container.kill(signal=sig)
        except docker.errors.DockerException as e:
            raise self._died(f"could not signal the supervisor ({e})") from e

    def _ensure_session(self) -> tuple[ShellSession, str]:
        if self.closed or self.container is None:
            raise SandboxError("sandbox is not started (use `with DockerSandbox(spec) as sb:`)")
        if self._dead_reason:
            raise SandboxDied(f"sandbox {self.id[:12]} died earlier ({self._dead_reason}); start a fresh one")
        if self._session is not None and self._session.alive:
            return self._session, ""
        restart = self._session is not None
        if restart:
            self._session.close()
        for delay in (0.5, 1.0, 2.0, None) if restart else (None,):
            try:
                self._session = self._new_session(self._cwd)
                break
            except SandboxError:
                # right after a sweep (a fork bomb's) the container may still be out of PIDs for a
                # moment under load: the new shell cannot fork yet, though the sandbox is fine
                if delay is None or self._dead_reason or not self._running():
                    raise
                time.sleep(delay)
        return self._session, f"[a new shell was started in {self._cwd}]"

    def _running(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except docker.errors.DockerException:
            return False

    def _head_commit(self, workdir: str) -> str | None:
        """HEAD of the repository at `workdir`, or None when it is not one. A second try covers a
        transient git failure (seen once under heavy load), which would otherwise make every later
        `diff()` fail for the whole episode."""
        for _ in range(2):
            raw = self._internal(f"git -C {workdir} rev-parse HEAD 2>&1")
            out = raw.output.decode(errors="replace")
            found = re.search(r"\b[0-9a-f]{40}\b", out)
            if raw.exit_code == 0 and found:
                return found.group(0)
            if "not a git repository" in out or "No such file" in out:
                return None
            time.sleep(0.2)
        return None

    def _internal(self, cmd: str, timeout: float = 60.0) -> RawResult:
        session, _ = self._ensure_session()
        nonce = session.send_internal(cmd, self._signals)
        try:
            return session.wait_result(nonce, time.monotonic() + timeout)
        except SandboxDied:
            raise self._died(f"shell lost during a harness command ({cmd.split()[0]})") from None
        except TimeoutError:
            raise SandboxError(f"harness command timed out after {timeout}s: {cmd}") from None

    # ---- commands ----------------------------------------------------------------------------
    def run(self, cmd: str, timeout: float | None = None) -> ExecResult:
        timeout = self.spec.default_timeout if timeout is None else timeout
        try:
            timeout = float(timeout)
        except (OverflowError, TypeError, ValueError):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r:.40}") from None
        if not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout}")
        _text(cmd, "the command", MAX_COMMAND_BYTES)
        t0 = time.monotonic()
        session, note = self._ensure_session()
        nonce = session.send_command(cmd, self._signals)
        timed_out = False
        watch = (DiskWatch(self._upper, size_bytes(self.spec.disk_limit, "disk_limit"), self._signal,
                           name=self.id[:12]) if self._upper else None)
        try:
            try:
                try:
                    raw = session.wait_result(nonce, t0 + timeout)
                except TimeoutError:
                    timed_out = True
                    self._raise_if_paused()
                    raw = self._kill_running(session, nonce)
                    if raw is None:
                        note = _join(note,
                                     "[the command did not stop, so the shell was killed and restarted]")
                        raw = self._recover_output()
            except SandboxDied:
                # The shell went away without a marker: killed from outside the session.
                raw = None
            if raw is None and not timed_out:
                err = self._died("the shell was killed while running a command")
                if isinstance(err, SandboxDied):
                    raise err from None
                note = _join(note, "[the shell was killed (by the OOM killer or a signal); a new shell "
                                   "will be started]")
                raw = self._recover_output(exit_code=137)
        except BaseException:
            if watch is not None:
                watch.finish()
            raise
        disk_hit = watch.finish() if watch is not None else False
        if disk_hit:
            stopped = "the command was stopped" if watch is not None and watch.hit else ("the command ended "
                                                                                         "first")
            note = _join(note,
                         f"[the sandbox's files outgrew its disk limit of {self.spec.disk_limit}: {stopped}; "
                               "delete files to go on]")
        if raw is None:  # nothing came back, not even after recovery: the sandbox is unusable
            self._raise_if_paused()
            raise self._died("no result came back from the shell, even after recovery")
        self._cwd = raw.cwd or self._cwd
        output, total, limit_hit = self._shape_output(raw.output)
        return ExecResult(
            exit_code=raw.exit_code, output=output, duration_s=time.monotonic() - t0,
            timed_out=timed_out, oom=raw.oom_kills > 0, output_bytes=total,
            output_limit_hit=limit_hit, disk_limit=disk_hit, note=note,
        )

    def _kill_running(self, session: ShellSession, nonce: str) -> RawResult | None:
        """Stop a timed-out command, escalating; keeps the shell (and its state) whenever possible."""
        # 1. Ctrl-C: every process but the harness shell gets SIGINT.
        bomb = self._near_pids_limit()  # counted first: the interrupt frees a few PIDs for a moment
        self._signal("SIGUSR1")
        if bomb:
            # A fork bomb: its background jobs ignore SIGINT, and the shell itself may be the one
            # re-spawning it (a fork it keeps retrying), so only a sweep that takes the shell too
            # ends it. Wait until the PIDs are free again, or the new shell could not even start.
            self._signal("SIGHUP")
            session.close()
            deadline = time.monotonic() + 10
            while self._near_pids_limit() and time.monotonic() < deadline:
                time.sleep(0.1)
            return None
        # 2. Ctrl-C once more: under load the first one can land while the command's process is
        #    still starting (its SIGINT disposition not yet reset), and it would go on;
        # 3. SIGKILL to everything but the shell (commands that ignore SIGINT);
        # 4. the shell itself is stuck: kill it too, the caller starts a new one.
        for grace, escalation in ((1.0, "SIGUSR1"), (_KILL_GRACE_S, "SIGUSR2"), (_KILL_GRACE_S, "SIGHUP")):
            try:
                return session.wait_result(nonce, time.monotonic() + grace)
            except (TimeoutError, SandboxDied):
                pass
            self._signal(escalation)
        try:
            return session.wait_result(nonce, time.monotonic() + _KILL_GRACE_S)
        except (TimeoutError, SandboxDied):
            session.close()
            return None

    def _near_pids_limit(self) -> bool:
        """Counted from the host (`docker top`), since nothing can be forked in the container then."""
        try:
            return len(self.container.top()["Processes"] or []) >= 0.8 * self.spec.pids
        except (docker.errors.DockerException, KeyError, TypeError):
            return False

    def _recover_output(self, exit_code: int = 137) -> RawResult:
        """After the shell was lost: what the command wrote, read through a fresh shell (started with
        retries: the sweep that took the old one may still be running)."""
        raw = self._internal(f"head -c {self.spec.output_limit} {OUT_FILE} 2>/dev/null")
        return RawResult(exit_code=exit_code, output=raw.output, oom_kills=0, cwd=self._cwd)

    def _shape_output(self, head: bytes) -> tuple[str, int, bool]:
        """Cap the output: first and last halves of the limit, with a marker of what was cut."""
        limit = self.spec.output_limit
        if len(head) < limit:
            return head.decode("utf-8", "replace"), len(head), False
        keep = limit // 2
        raw = self._internal(f"stat -c %s {OUT_FILE}; df -B1 --output=avail {RUN_DIR} | tail -1; "
                             f"tail -c {keep} {OUT_FILE}")
        size_line, avail_line, tail = raw.output.split(b"\n", 2)
        total = int(size_line)
        limit_hit = int(avail_line) < 64 * 1024
        if total <= limit:  # exactly `limit` bytes: all of it is in `head`
            return head.decode("utf-8", "replace"), total, limit_hit
        cut = total - keep - len(tail)
        marker = (f"\n\n[... {cut} bytes of output cut: showing the first {keep} and last {len(tail)} of "
                  f"{total} bytes")
        if limit_hit:
            marker += (f"; the command hit the {self.spec.output_spool} output limit and its later writes "
                       "failed")
        marker += " ...]\n\n"
        text = head[:keep].decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")
        return text, total, limit_hit

    # ---- files -------------------------------------------------------------------------------
    # read_file / write_file act as the command's user, like a command would: Docker's archive API
    # reads and writes as root, and an editor that wrote as root could replace a program the root
    # harness runs (setpriv) and so forge every later result, or read what the image keeps from the
    # agent (hidden tests).
    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        path = _abs(path)
        max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
        q = _quote(path)
        raw = self._internal(
            f"p={q}; if ! t=$(LC_ALL=C stat -L -c '%s' -- \"$p\" 2>&1); then "
            "case $t in *'Permission denied'*) echo P;; *) echo N;; esac; "
            "elif [ -d \"$p\" ]; then echo D; elif [ ! -f \"$p\" ]; then echo X; elif [ ! -r \"$p\" ]; then "
            f"echo P; else echo \"F $t\"; if [ \"$t\" -le {max_bytes} ]; then exec cat -- \"$p\"; fi; fi",
            timeout=120)
        head, _, data = raw.output.partition(b"\n")
        kind, _, size = head.decode(errors="replace").partition(" ")
        if kind == "N":
            raise FileNotFoundError(f"no such file in the sandbox: {path}")
        if kind == "D":
            raise IsADirectoryError(f"{path} is a directory in the sandbox")
        if kind == "X":
            raise IsADirectoryError(f"{path} is not a regular file in the sandbox")
        if kind == "P":
            raise PermissionError(f"{path}: permission denied for the sandbox user {self._user}")
        if kind != "F" or raw.exit_code != 0:
            raise SandboxError(f"reading {path} failed in the sandbox: "
                               f"{raw.output[-300:].decode(errors='replace')}")
        if int(size) > max_bytes:
            raise ValueError(f"{path} is {size} bytes, over the {max_bytes}-byte limit for read_file")
        if len(data) != int(size):  # it changed while being read (a background process writing it)
            raise SandboxError(f"{path} changed while it was read ({size} bytes, {len(data)} read); read it "
                               "again")
        return data

    def _owner(self) -> tuple[int, int]:
        session, _ = self._ensure_session()
        return session.uid, session.gid

    def _put_tar(self, dest_dir: str, data: bytes) -> None:
        raw = self._internal(f"mkdir -p -- '{dest_dir}'")
        if raw.exit_code != 0:
            raise PermissionError(f"cannot create {dest_dir} in the sandbox: "
                                  f"{raw.output.decode(errors='replace')}")
        try:
            self.container.put_archive(dest_dir, data)
        except docker.errors.APIError as e:
            raise self._died(f"writing into {dest_dir} failed ({e})") from e

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        path = _abs(path)
        if isinstance(data, str):
            data = data.encode("utf-8")
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"write_file data is {len(data)} bytes, over the {MAX_FILE_BYTES}-byte limit")
        uid, gid = self._owner()
        # staged in the user's own directory (under root's /, so it cannot be swapped for a link), then
        # moved into place by the user: the move succeeds exactly where the user may write
        name = os.urandom(8).hex()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, gid, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        try:
            self.container.put_archive(STAGE_DIR, buf.getvalue())
        except docker.errors.APIError as e:
            raise self._died(f"staging {path} failed ({e})") from e
        parent = _quote(str(PurePosixPath(path).parent))
        raw = self._internal(f"mkdir -p -- {parent} && mv -f -T -- {STAGE_DIR}/{name} {_quote(path)}; "
                             f"rc=$?; rm -f -- {STAGE_DIR}/{name}; exit $rc")
        if raw.exit_code != 0:
            why = raw.output.decode(errors="replace").strip().splitlines()
            why = why[-1] if why else f"exit {raw.exit_code}"
            if "Permission denied" in why or "Read-only file system" in why:
                raise PermissionError(f"cannot write {path}: permission denied for the sandbox user "
                                      f"{self._user}")
            if any(w in why
                   for w in ("Is a directory", "Not a directory", "File exists", "cannot overwrite")):
                raise IsADirectoryError(f"cannot write {path}: it or one of its parents is a directory / "
                                        "not a directory")
            raise SandboxError(f"writing {path} failed in the sandbox: {why}")

    def upload(self, src: str | Path, dest: str) -> None:
        dest = _abs(dest, "dest")
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist on the host")
        uid, gid = self._owner()

        def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
            return info

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=src.name, filter=owned)
        self._put_tar(dest, buf.getvalue())

    def diff(self, base: str | None = None) -> str:
        base = base or self.base_commit
        if base is None:
            raise SandboxError(f"{self.spec.workdir} was not a git repository at start; pass base= "
                               "explicitly")
        # the repository's config is the agent's: no fsmonitor hook, external diff or textconv of its
        # choosing runs in this harness command, and no sparse checkout hides files from it
        git = ("git -c safe.directory='*' -c core.fileMode=false -c core.fsmonitor=false -c "
               "core.hooksPath=/dev/null -c core.sparseCheckout=false")
        # Staged in a fresh index read from `base`, never a copy of the agent's: a copied index is
        # newer than its entries, so an edit of the same size in the same second as the agent's last
        # `git add` looks clean (git's racy-entry check goes by the index file's mtime), and its
        # assume-unchanged / skip-worktree bits would hide edits. Hashing every tracked file instead
        # costs about 0.1 s for sympy's 55 MB. The agent's own index is left as it was.
        idx = f"{STAGE_DIR}/index.{os.urandom(4).hex()}"
        raw = self._internal(
            f"cd {self.spec.workdir} && GIT_INDEX_FILE={idx} {git} read-tree {_quote(base)} 2>&1 && "
            f"GIT_INDEX_FILE={idx} {git} add -A 2>&1 >/dev/null && "
            f"GIT_INDEX_FILE={idx} {git} diff --cached --binary --no-color --no-ext-diff --no-textconv "
            f"{_quote(base)} 2>/dev/null; rc=$?; rm -f {idx}; exit $rc"
        )
        if raw.exit_code != 0:
            raise SandboxError(f"git diff failed in {self.spec.workdir}: "
                               f"{raw.output.decode(errors='replace')}")
        # surrogateescape: a patch of a non-UTF-8 file must round-trip byte for byte
        return raw.output.decode("utf-8", "surrogateescape")

    def __repr__(self) -> str:
        return f"DockerSandbox(image={self.spec.image!r}, id={self.id[:12]!r}, run={self.run_id!r})"


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _join(a: str, b: str) -> str:
    return f"{a}\n{b}" if a else b

