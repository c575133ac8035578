"""What a build installs: every package of a layer resolved by pip against the as-of index
(`swerl.envs.swe.pypi`) for the spec's Python, into the folder the layer installs from offline — and that
folder's lock.

The host resolves for the spec's Python: with an interpreter of that version (its own, or `pythonX.Y`
on PATH with pip) sdists are allowed; with any other, pip resolves for the version by `--python-version`
/ `--abi` with the environment markers of the base image's python3 (pip would evaluate
`python_version < "3.11"` for itself), the ABI (`cp36m` before 3.8) and the manylinux tags the image's
glibc runs (no manylinux_2_28 on xenial's 2.23 or bionic's 2.27), wheels only. What that cannot resolve
is then resolved again, whole, by the image's own python3 in a throwaway container: a pin that has only
an sdist (atomicwrites in pytest 4.x's specs), one deep in a requirements file (docopt under pylint's
coveralls, where pip reports a conflict), a requirements file (`-r`, mounted), a repository whose setup.py
runs only on the spec's Python (requests 2.4's imports what 3.10 dropped).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docker.errors

from swerl.envs.swe.images import ImageUnavailable
from swerl.envs.swe.pypi import AsOfIndex, canonical
from swerl.files import sha256_file
from swerl.sandbox import lifecycle

LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
"""What pip builds a project without a [build-system] table with (wheel: setuptools < 70.1 needs it)."""


class BuildError(ValueError):
    """A row cannot be built here: its spec needs what this machine cannot give (another Python, conda,
    apt packages, the network), its mirror is missing, or a package cannot be had."""


def host_python(python: str) -> str | None:
    """A host interpreter of version `python` with pip (this one, or `pythonX.Y` on PATH), on the
    image's platform: pip run by it resolves exactly as in the image, sdists included. None if none."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == python:
        return sys.executable
    exe = shutil.which(f"python{python}")
    if exe and subprocess.run([exe, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return exe
    return None


_MARKER_PROBE = """import json, os, platform, sys
v = sys.implementation.version
tail = "" if v.releaselevel == "final" else v.releaselevel[0] + str(v.serial)
print(json.dumps({"implementation_name": sys.implementation.name,
                  "implementation_version": "%d.%d.%d%s" % (v.major, v.minor, v.micro, tail), \
"os_name": os.name,
                  "platform_machine": platform.machine(), "platform_release": platform.release(),
                  "platform_system": platform.system(), "platform_version": platform.version(),
                  "python_full_version": platform.python_version(),
                  "platform_python_implementation": platform.python_implementation(),
                  "python_version": "%d.%d" % sys.version_info[:2], "sys_platform": sys.platform}))
"""
"""Run by an image's python3: its environment markers, as `packaging.markers.default_environment` makes
them."""

_PIP_WITH_MARKERS = """import json, sys
from pip._vendor.packaging import markers
env = json.loads(sys.argv.pop(1))
markers.default_environment = lambda: dict(env)
from pip._internal.cli.main import main
sys.exit(main())
"""
"""`python -c _PIP_WITH_MARKERS ENV_JSON download ...`: pip, evaluating markers in ENV_JSON's environment
(`--python-version` changes only the tags and Requires-Python pip checks, not the markers)."""


def marker_environment(client: Any, image: str) -> dict[str, str]:
    """The environment markers of `image`'s python3 (one short container, no network)."""
    try:
        out = client.containers.run(image, ["python3", "-c", _MARKER_PROBE], remove=True,
                                    network_disabled=True, user="root")
        env = json.loads(out)
    except (docker.errors.DockerException, ValueError) as e:
        raise ImageUnavailable(f"reading the environment markers of {image}'s python3 failed: {e}") from e
    env = {str(k): str(v) for k, v in env.items()}
    # Ubuntu's xenial says 3.5.1+ (a build past the release), which is no PEP 440 version: a marker
    # comparing python_full_version would stop pip
    env["python_full_version"] = env.get("python_full_version", "").rstrip("+")
    return env


def glibc_version(client: Any, image: str) -> tuple[int, int]:
    """The glibc of `image` (its python3's), e.g. (2, 27): which manylinux wheels run there."""
    probe = "import os; print(os.confstr('CS_GNU_LIBC_VERSION'))"  # "glibc 2.27"
    try:
        out = client.containers.run(image, ["python3", "-c", probe], remove=True, network_disabled=True,
                                    user="root")
        major, minor = out.decode().split()[-1].split(".")[:2]
        return int(major), int(minor)
    except (docker.errors.DockerException, ValueError, IndexError) as e:
        raise ImageUnavailable(f"reading the glibc version of {image} failed: {e}") from e


def manylinux_platforms(glibc: tuple[int, int]) -> list[str]:
    """pip's --platform values for wheels that run on `glibc`: manylinux2014 (glibc 2.17, and pip adds
    manylinux2010 and manylinux1 to it), and manylinux_2_28 where the glibc has it (Ubuntu's xenial and
    bionic do not: a wheel of it would be refused by the image's pip)."""
    return ["manylinux2014_x86_64"] + (["manylinux_2_28_x86_64"] if glibc >= (2, 28) else [])


def cpython_abi(python: str) -> str:
    """CPython's ABI tag of `python`: cp36m before 3.8 (pymalloc builds had the `m` flag), cp38 on."""
    major, minor = (int(x) for x in python.split(".")[:2])
    return f"cp{major}{minor}" + ("m" if (major, minor) < (3, 8) else "")


class Resolver:
    """`pip download` for one Python version against the as-of index (`swerl.envs.swe.pypi`), never
    anything else: the user's pip configuration (find-links, constraints, extra indexes) is left out, so
    what a build holds depends on its row only. With a host interpreter of the version (`exe`), pip
    resolves as in the image, sdists included; with none, pip resolves for it by --python-version,
    `markers` and the manylinux `platforms` of the image's glibc, wheels only — and what that cannot
    resolve is resolved by the image's own python3 (`image`), in a throwaway container on the host's
    network (where the index is served)."""

    def __init__(self, index: AsOfIndex, *, python: str, exe: str | None, markers: dict[str, str] | None,
                 work: Path, platforms: Sequence[str] = (), image: str | None = None, client: Any = None,
                 log: Callable[[str], None] | None = None) -> None:
        if exe is None and (markers is None or not platforms):
            raise ValueError("Resolver: resolving for another Python needs its environment markers and "
                             "platforms")
        self.index, self.python, self.exe, self.markers, self.log = index, python, exe, markers, log
        self.platforms = tuple(platforms)
        self.image, self.client, self.work = image, client, work
        self._pip_for_image: Path | str | None = None

    @property
    def offline(self) -> bool:
        return self.index.offline

    def _pip(self, args: Sequence[str], dest: Path, *, binary_only: bool) -> subprocess.CompletedProcess:
        pip = ([self.exe, "-m", "pip"] if self.exe else
               [sys.executable, "-c", _PIP_WITH_MARKERS, json.dumps(self.markers)])
        cmd = [*pip, "download", "--disable-pip-version-check", "--progress-bar", "off", "--no-cache-dir",
               "--index-url", self.index.url, "-d", str(dest)]
        if self.exe is None:
            cmd += ["--python-version", self.python, "--implementation", "cp",
                    "--abi", cpython_abi(self.python), "--abi", "abi3", "--abi", "none",
                    *(a for p in self.platforms for a in ("--platform", p))]
        if self.exe is None or binary_only:
            # pip allows no sdist under these options: its metadata would come from running its setup on
            # this interpreter, not the image's
            cmd.append("--only-binary=:all:")
        return subprocess.run([*cmd, *args], capture_output=True, text=True, env=isolated_pip_env())

    def collect(self, args: Sequence[str], dest: Path, *, what: str, binary_only: bool = False) -> None:
        """Put what `args` (requirements, `-r FILE`, a project folder) needs into `dest`."""
        if not args:
            return
        seen = len(self.index.misses), len(self.index.errors)
        got = self._pip(args, dest, binary_only=binary_only)
        if got.returncode == 0:
            return
        why = _last_error(got.stdout + got.stderr)
        if self.exe is None and not binary_only:
            # wheels only, and a project's setup run by this interpreter, not the spec's: whatever failed
            # (an sdist-only pin, one deep in a requirements file that pip reports as a conflict, a
            # setup.py that imports what this Python no longer has) may resolve as the image resolves it
            if self.image is not None:
                in_image = self._collect_in_image(args, dest)
                if in_image is None:
                    return
                why = in_image
            elif _NEEDS_INTERPRETER.search(got.stdout + got.stderr):
                why += (f" (for Python {self.python} only wheels can be had here: no host interpreter of "
                        f"that version to prepare sdists with — put python{self.python} with pip on PATH)")
        raise BuildError(f"{what}: pip could not resolve it against the package index as of "
                         f"{self.index.as_of}: {why}{self._index_trouble(*seen)}")

    def _index_trouble(self, misses: int, errors: int) -> str:
        """What the index could not serve since (`misses`, `errors`) — offline, unreachable."""
        new = self.index.errors[errors:] or self.index.misses[misses:]
        if not new:
            return ""
        offline = self.index.offline and not self.index.errors[errors:]
        tail = " (run once without --offline)" if offline else ""
        return f"; the index did not have {'; '.join(dict.fromkeys(new[:3]))}{tail}"

    def _collect_in_image(self, args: Sequence[str], dest: Path) -> str | None:
        """What wheels alone could not give, for a Python this machine has no interpreter of: pip run by
        the image's own python3 (metadata from setups run there, markers and tags the image's; host files
        and folders in `args` mounted). None when everything is in `dest`, else pip's last error."""
        if self._pip_for_image is None:
            folder = self.work / f"pip-{self.python}"
            folder.mkdir(parents=True, exist_ok=True)
            try:
                self.collect(["pip"], folder, what=f"pip for Python {self.python}", binary_only=True)
                self._pip_for_image = sorted(folder.glob("pip-*.whl"), key=_wheel_version)[-1]
            except BuildError as e:
                self._pip_for_image = str(e)
        if isinstance(self._pip_for_image, str):
            return f"{' '.join(args)[:200]} needs the image's python{self.python}, and {self._pip_for_image}"
        pip_wheel = self._pip_for_image
        inside, volumes = _in_container(args)
        volumes.update({str(pip_wheel.parent): {"bind": "/swerl-pip", "mode": "ro"},
                        str(dest.resolve()): {"bind": "/swerl-dest", "mode": "rw"}})
        # (swerl's base images set PIP_NO_INDEX=1 for the sandboxes: this run lifts it; HOME: the host's
        # user has none in the image)
        env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off", "PIP_NO_CACHE_DIR": "1",
               "PIP_NO_INDEX": "0", "HOME": "/tmp"}
        cmd = ["python3", f"/swerl-pip/{pip_wheel.name}/pip", "download", "-d", "/swerl-dest",
               "--index-url", self.index.url, *inside]
        if self.log:
            self.log(f"resolving {' '.join(args)[:200]} with the image's python{self.python}")
        try:
            # the host's network: the index listens on its 127.0.0.1; the host's user, so that what pip
            # writes (the downloads, a project's egg-info) is the host's to remove
            code, output = run_throwaway(self.client, self.image, cmd, environment=env, volumes=volumes,
                                          network_mode="host", user=host_user())
        except docker.errors.DockerException as e:
            raise ImageUnavailable(f"running pip in {self.image} failed: {e}") from e
        if code == 0:
            return None
        return f"{_last_error(output)} (pip run by the image's python{self.python})"

    def sdist_build_requires(self, dest: Path, *, what: str) -> None:
        """The build requirements of every sdist in `dest`, into `dest` (an image builds them offline)."""
        seen: set[str] = set()
        for _ in range(4):
            sdists = [p for p in sorted(dest.iterdir()) if p.name not in seen and not p.name.endswith(".whl")]
            if not sdists:
                return
            reqs: list[str] = []
            for p in sdists:
                seen.add(p.name)
                reqs += [r for r in _archive_build_requires(p) if r not in reqs]
            self.collect(reqs, dest,
                         what=f"{what}: build requirements of {', '.join(p.name for p in sdists)[:200]}")


def isolated_pip_env() -> dict[str, str]:
    """This process's environment without the user's pip configuration (PIP_* variables, pip.conf files):
    a find-links folder, a constraint or an extra index would change what resolves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def lock_of(folder: Path) -> list[str]:
    """The lock of a wheel set: `FILE sha256` per file, sorted — every file a layer installs from."""
    return [f"{p.name} {sha256_file(p)}" for p in sorted(folder.iterdir()) if p.is_file()]


def lock_digest(lock: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lock).encode()).hexdigest()


def lock_diff(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """`- FILE` / `+ FILE` for what differs between two locks (a changed hash: both)."""
    a, b = set(old), set(new)
    return [f"- {x.split()[0]}" for x in sorted(a - b)] + [f"+ {x.split()[0]}" for x in sorted(b - a)]


def pins(folder: Path, names: Sequence[str]) -> list[str]:
    """`name==version` of each of `names` among the wheels in `folder` (one each)."""
    out = []
    for name in names:
        found = [p for p in folder.glob("*.whl") if canonical(p.name.split("-")[0]) == canonical(name)]
        if len(found) != 1:
            raise BuildError(f"{folder}: {len(found)} wheels of {name}, not one")
        out.append(f"{name}=={found[0].name.split('-')[1]}")
    return out


def run_throwaway(client: Any, image: str, cmd: Sequence[str], *, network_mode: str,
                   volumes: dict[str, dict[str, str]], environment: dict[str, str] | None = None,
                   user: str = "root") -> tuple[int, str]:
    """(exit code, output) of `cmd` run as `user` in a container of `image` that is removed afterwards,
    whatever happens (registered with the reaper meanwhile)."""
    container = client.containers.create(image, list(cmd), user=user, environment=environment or {},
                                         volumes=volumes, network_mode=network_mode,
                                         labels=lifecycle.owner_labels(lifecycle.default_run_id()))
    lifecycle.register(container.id, client)
    try:
        container.start()
        code = container.wait(timeout=1800).get("StatusCode", 1)
        return code, container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)
        lifecycle.unregister(container.id)


def _last_error(output: str) -> str:
    """pip's last ERROR line (else its last line), cut to 400 characters."""
    errors = ([ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR")]
              or output.strip().splitlines())
    return errors[-1][:400] if errors else "pip failed"


_NEEDS_INTERPRETER = re.compile(r"no matching distribution|Failed to build|metadata-generation-failed",
                                re.IGNORECASE)
"""pip's words for what wheels alone, or a setup run by another Python, could not give."""


_FILE_OPTIONS = ("-r", "--requirement", "-c", "--constraint")


def _in_container(args: Sequence[str]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """`args` as a container sees them, and the mounts that make it so: the folder of each file a `-r` /
    `-c` names, read-only (a requirements file may `-r` a sibling), and each project folder (`DIR` or
    `DIR[extras]`), read-write (pip prepares its metadata in the tree)."""
    out: list[str] = []
    volumes: dict[str, dict[str, str]] = {}
    for k, arg in enumerate(args):
        project = re.fullmatch(r"(.+?)(\[[^\]]*\])?", arg)
        if k and args[k - 1] in _FILE_OPTIONS:
            path = Path(arg).resolve()
            mount = volumes.setdefault(str(path.parent), {"bind": f"/swerl-in/{k}", "mode": "ro"})["bind"]
            out.append(f"{mount}/{path.name}")
        elif not arg.startswith("-") and project and os.sep in arg and Path(project[1]).is_dir():
            folder = Path(project[1]).resolve()
            volumes[str(folder)] = {"bind": f"/swerl-in/{k}", "mode": "rw"}
            out.append(f"/swerl-in/{k}" + (project[2] or ""))
            # a clone that borrows its objects (`git clone --shared`) needs them where it says, for a
            # version read by `git describe` (setuptools-scm)
            alternates = folder / ".git" / "objects" / "info" / "alternates"
            for line in alternates.read_text().splitlines() if alternates.is_file() else []:
                if line.strip() and os.path.isabs(line.strip()):
                    volumes.setdefault(line.strip(), {"bind": line.strip(), "mode": "ro"})
        else:
            out.append(arg)
    return out, volumes


def host_user() -> str:
    """`uid:gid` of this process: a throwaway container that writes into the host's folders runs as it."""
    return f"{os.getuid()}:{os.getgid()}" if hasattr(os, "getuid") else "root"


def _wheel_version(path: Path) -> tuple[int, ...]:
    """`pip-21.3.1-py3-none-any.whl` → (21, 3, 1): pip 9 sorts before pip 21."""
    return tuple(int(x) for x in re.findall(r"\d+", path.name.split("-")[1]))


def host_pip_cert() -> str | None:
    """The CA bundle this machine's pip trusts: PIP_CERT, else `pip config`'s cert, if either names one."""
    if os.path.isfile(os.environ.get("PIP_CERT", "")):
        return os.environ["PIP_CERT"]
    got = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in got.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".cert"):
            path = value.strip().strip("'\"")
            if os.path.isfile(path):
                return path
    return None


def _archive_build_requires(path: Path) -> list[str]:
    """[build-system] requires of an sdist (pip's default for one without)."""
    text = None
    try:
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith("/pyproject.toml")]
                text = z.read(names[0]).decode() if names else None
        else:
            with tarfile.open(path) as t:
                for m in t:
                    if m.isfile() and m.name.count("/") == 1 and m.name.endswith("/pyproject.toml"):
                        f = t.extractfile(m)
                        text = f.read().decode() if f else None
                        break
    except (OSError, tarfile.TarError, zipfile.BadZipFile, UnicodeDecodeError):
        return list(LEGACY_BUILD_REQUIRES)
    return build_requires(text)


def build_requires(pyproject: str | None) -> list[str]:
    if pyproject is None:
        return list(LEGACY_BUILD_REQUIRES)
    try:
        table = tomllib.loads(pyproject).get("build-system") or {}
    except tomllib.TOMLDecodeError:
        return list(LEGACY_BUILD_REQUIRES)
    reqs = [str(r) for r in table.get("requires", LEGACY_BUILD_REQUIRES)]
    if any(re.match(r"setuptools\b", r) for r in reqs) and not any(re.match(r"wheel\b", r) for r in reqs):
        reqs.append("wheel")
    return reqs


