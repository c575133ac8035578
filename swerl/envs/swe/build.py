"""SWE-bench's three images (base, environment, instance) for Python repositories, built here from
SWE-bench's own specs, a local git mirror and packages downloaded on the host — no registry, no network
inside a build.

`swerl tasks build-images --tasks FILE --repos DIR` does what SWE-bench's image builder does, on a
machine where no container registry, conda channel or GitHub is reachable (only PyPI, from the host):

- **Specs.** What each layer holds comes from swebench 4.1.0's spec tables, as for grading
  (`swerl.envs.swe.specs`): `_spec_oracle.py build` makes SWE-bench's environment script with the
  requirements.txt / environment.yml it would fetch from GitHub read from the mirror at the row's
  environment_setup_commit instead, so the image names are SWE-bench's own:
  `sweb.base.py.x86_64:latest`, `sweb.env.py.x86_64.<hash of the env script>:latest`,
  `sweb.eval.x86_64.<instance id>:latest` (the `image` a published row is given), which
  `resolve_image` then finds locally and scrubs like any pulled image.
- **Mirrors.** `--repos DIR` holds one git repository per SWE-bench repository `owner/name`:
  `DIR/owner__name.git` (a bare mirror, `git clone --mirror`), `DIR/owner__name`, or `DIR/owner/name`
  (any clone). It must have the rows' base_commit and environment_setup_commit.
- **Packages.** What a layer installs is downloaded on the host with `pip download` into the wheels
  folder (`--wheels`, default `.cache/swe/wheels`; tasks/swe/wheels is searched too), which is tried
  first without the network (`--offline`: only that). Builds run with `--network none` and install
  with `pip --no-index` from those files; sdists are built in the image from the downloaded build
  requirements. The host resolves for Python 3.11 (its own interpreter when that is 3.11, sdists
  allowed; wheels only otherwise).
- **Base layer.** swerl's base image (`swerl sandbox build-base`: Debian bookworm, Python 3.11, git),
  not SWE-bench's Ubuntu + Miniconda (which needs the network), plus swerl's `conda activate` shim at
  /opt/miniconda3/bin/activate (sandbox/conda_activate.sh).
- **Environment layer.** A venv at /opt/miniconda3/envs/testbed, the path of SWE-bench's conda env,
  with the base image's Python 3.11 — the only Python there is: a spec asking for another version is an
  error naming it. Then, in SWE-bench's order: the spec's conda packages (a `packages` list, or an
  environment.yml's dependencies) installed from PyPI under the same names (`name=1.2` meaning
  `name==1.2.*`); `requirements.txt` from the mirror; `pip_packages`. A conda dependency that is not a
  Python package (compilers, C libraries, tools) is an error naming it, as is one PyPI does not have.
  The spec's `pre_install` apt installs must already be in the base image (there is no apt inside a
  build): the missing ones are named; steps that fetch from the network (wget, curl, git clone) are
  errors too; other steps (sed on setup.py, ...) run as written.
- **Instance layer.** The repository at base_commit with its history up to there (a bundle of the
  mirror's base_commit, nothing after it) at /testbed, owned by the sandbox user, on branch `main`;
  then SWE-bench's install steps (`pip install -e .` ...) run offline as root in the testbed env.
  Unlike SWE-bench's images, HEAD stays base_commit (no "SWE-bench" commit on top, which the scrub would
  refuse): tracked files an install step changed are put back and reported, and the untracked files it
  made (egg-info, build/) go into .git/info/exclude so the agent's diff does not show them.

SWE-bench's eval script reinstalls the repository (`pip install -e .`) before the tests; in a grading
container (no network, the sandbox user) that step fails at once and the tests run on the install made
at build time, as they do for pulled images graded here: a patch that changes the packaging metadata
(new dependencies, entry points) is not reinstalled.

Every layer is cached by a content hash (`swerl.content-hash`): an unchanged one costs one lookup. An
image of the instance's name that swerl did not build (a pulled SWE-bench image) is kept unless
`force`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors

from swerl.envs.swe.images import CACHE_ROOT, TASKS_ROOT, ImageUnavailable
from swerl.envs.swe.specs import ORACLE, SPEC_RELEASE, SpecError, _plain, spec_release_dir
from swerl.sandbox import lifecycle
from swerl.sandbox.images import BASE_TAG, LABEL_HASH
from swerl.sandbox.session import asset
from swerl.structs import SWEInstance

BASE_PYTHON = "3.11"
"""The one Python the base image has (Debian bookworm's); every testbed env is a venv of it."""
WHEELS_CACHE = CACHE_ROOT / "wheels"
"""Default folder of the packages downloaded for builds (`--wheels`)."""
LAYER_LABEL = "swerl.swebench-layer"
"""base | env | instance on the images built here."""
ENV_DIR = "/opt/miniconda3/envs/testbed"
IN_IMAGE_WHEELS = "/tmp/swerl-wheels"
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
"""What pip builds a project without a [build-system] table with (wheel: setuptools < 70.1 needs it)."""
BUILD_TOOLS = ("pip", "setuptools", "wheel")
"""In every environment's wheel set: the venv's own pip and the default build backend."""
NON_PYTHON_CONDA = frozenset({
    "c-compiler", "cxx-compiler", "fortran-compiler", "compilers", "gcc", "gxx", "gfortran", "clang", "make",
    "cmake", "pkg-config", "nodejs", "yarn", "graphviz", "pandoc", "ffmpeg", "ghostscript", "imagemagick",
    "texlive-core", "tectonic", "git", "mkl", "openblas", "blas", "cudatoolkit", "cudnn", "freetype", "qhull",
    "hdf5", "zlib", "sqlite", "openssl", "icu", "gdal", "proj", "geos", "tk", "xz", "bzip2", "r-base", "go",
    "rust", "curl", "wget", "enchant", "hunspell", "poppler", "cairo", "pango", "boost", "eigen", "libffi",
    "libxml2", "libxslt", "libgdal", "libspatialindex", "libblas", "liblapack", "libgfortran"})
"""Conda packages that are not Python packages (a PyPI project of that name is something else or
nothing): an environment asking for one cannot be made from PyPI."""
_NETWORK_STEP = re.compile(r"\b(wget|curl)\b|\bgit\s+(clone|fetch|pull)\b|\bpip\s+download\b")


class BuildError(ValueError):
    """A row cannot be built here: its spec needs what this machine cannot give (another Python, conda,
    apt packages, the network), its mirror is missing, or a package cannot be had."""


@dataclass(frozen=True)
class BuildPlan:
    """What the three images of one instance hold (made by `plan_builds` from SWE-bench's spec)."""

    instance_id: str
    repo: str
    version: str
    mirror: Path
    """The git directory of the repository's local mirror."""
    base_commit: str
    env_commit: str
    """environment_setup_commit (base_commit when the row has none): where requirements are read."""
    python: str
    base_image: str
    """SWE-bench's names, from its TestSpec: `sweb.base.py.x86_64:latest`, ..."""
    env_image: str
    instance_image: str
    also_tag: tuple[str, ...]
    """Other names the instance image gets (the row's own `image`, when it names another)."""
    conda_packages: tuple[str, ...]
    """The spec's conda packages as pip requirements (installed first)."""
    requirements: str
    """requirements.txt as SWE-bench's env script installs it (read from the mirror), or empty."""
    pip_packages: tuple[str, ...]
    apt_packages: tuple[str, ...]
    """Debian packages the spec's pre_install apt-installs: the base image must have them."""
    steps: tuple[str, ...]
    """The instance layer's setup, in SWE-bench's order: the repo's install step, pre_install (apt
    steps taken out), install."""
    project: str
    """What the install step installs of the repository (`.`, `.[test]`): its dependencies are
    downloaded too."""


@dataclass(frozen=True)
class BuildResult:
    """One instance's images (SWE-bench's names), or why they could not be built."""

    instance_id: str
    base_image: str = ""
    env_image: str = ""
    instance_image: str = ""
    built: tuple[str, ...] = ()
    """Images built by this call (the others were up to date or kept)."""
    notes: tuple[str, ...] = ()
    """What the build changed from SWE-bench's recipe (tracked files an install step changed, put back)."""
    error: str = ""
    bad_input: bool = False
    """The error is the row's or its spec's (unsupported, missing mirror), not the build's."""

    @property
    def ok(self) -> bool:
        return not self.error


# ---- mirrors ----------------------------------------------------------------------------------------


def _git(git_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    got = subprocess.run(["git", "-c", "safe.directory=*", f"--git-dir={git_dir}", *args], capture_output=True)
    if check and got.returncode != 0:
        raise BuildError(f"git {' '.join(args[:2])} in {git_dir} failed: "
                         f"{got.stderr.decode(errors='replace').strip()[-300:]}")
    return got


def mirror_candidates(repos: Path, repo: str) -> list[Path]:
    """Where `--repos` may hold `repo` (`owner/name`), in the order looked at."""
    owner, _, name = repo.partition("/")
    return [repos / f"{owner}__{name}.git", repos / f"{owner}__{name}", repos / owner / name,
            repos / owner / f"{name}.git"]


def find_mirror(repos: Path, repo: str) -> Path:
    """The git directory of `repo`'s mirror under `repos` (see `mirror_candidates`)."""
    if "/" not in repo:
        raise BuildError(f"repository {repo!r} is not owner/name")
    for cand in mirror_candidates(repos, repo):
        if (cand / "HEAD").is_file() and (cand / "objects").is_dir():
            return cand.resolve()  # bare
        if (cand / ".git").exists():
            got = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(cand), "rev-parse", "--absolute-git-dir"],
                                 capture_output=True, text=True)
            if got.returncode == 0:
                return Path(got.stdout.strip())
    tried = ", ".join(str(c) for c in mirror_candidates(repos, repo)[:3])
    raise BuildError(f"no mirror of {repo} under {repos} (looked for {tried}) — `git clone --mirror "
                     f"https://github.com/{repo} {mirror_candidates(repos, repo)[0]}` on a machine with GitHub")


def _has_commit(git_dir: Path, sha: str) -> bool:
    return _git(git_dir, "cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode == 0


# ---- plans ------------------------------------------------------------------------------------------


def _oracle_build(rows: list[dict], root: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(spec_release_dir(root)), "PYTHONNOUSERSITE": "1"}
    got = subprocess.run([sys.executable, str(ORACLE), "build"], input=json.dumps(rows), capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        raise SpecError(f"swebench {SPEC_RELEASE}'s spec tables failed to load: {tail[-1] if tail else got.returncode}")
    return json.loads(got.stdout)["rows"]


def conda_to_pip(spec: str, *, where: str) -> str | None:
    """A conda package spec as a pip requirement (`numpy=1.19` → `numpy==1.19.*`, `x::pkg` → `pkg`);
    None for `python` and `pip` (the venv has them). A non-Python conda package is a BuildError."""
    text = spec.strip().split("::", 1)[-1]
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", text)
    if not m:
        raise BuildError(f"{where}: conda package {spec!r} is not a name with an optional version")
    name, rest = m.group(1), m.group(2).replace(" ", "")
    if name.lower() in ("python", "pip"):
        return None
    if name.lower() in NON_PYTHON_CONDA or name.startswith("_"):
        raise BuildError(f"{where}: the conda package {name!r} is not a Python package (no conda channel is "
                         "reachable here and PyPI does not have it as such), so this environment cannot be built")
    if rest.startswith("=") and not rest.startswith("=="):
        version = rest[1:].split("=", 1)[0]  # conda's name=version=build
        rest = f"=={version}" if "*" in version else f"=={version}.*"
    return name + rest


def _apt_step(part: str) -> list[str] | None:
    """The packages of an `apt-get install` part, [] for update / upgrade, None for anything else."""
    words = shlex.split(part)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # DEBIAN_FRONTEND=noninteractive
    if not words or words[0] not in ("apt-get", "apt"):
        return None
    rest = [w for w in words[1:] if not w.startswith("-")]
    if rest[:1] in (["update"], ["upgrade"], ["clean"]):
        return []
    if rest[:1] == ["install"]:
        return rest[1:]
    raise BuildError(f"apt step {part!r} is neither update, upgrade nor install")


def _split_pre_install(steps: Sequence[str], where: str) -> tuple[list[str], list[str]]:
    """(apt packages, other steps) of the spec's pre_install."""
    apt: list[str] = []
    other: list[str] = []
    for step in steps:
        keep = []
        for part in re.split(r"&&|;", step):
            part = part.strip()
            if not part:
                continue
            try:
                pkgs = _apt_step(part)
            except ValueError as e:
                raise BuildError(f"{where}: the spec's pre_install step {step!r}: {e}") from None
            if pkgs is None:
                keep.append(part)
            else:
                apt += [p for p in pkgs if p not in apt]
        if keep:
            text = " && ".join(keep)
            if _NETWORK_STEP.search(text):
                raise BuildError(f"{where}: the spec's pre_install step {step!r} fetches from the network, which a "
                                 "build here does not have")
            other.append(text)
    return apt, other


def _environment_yml(text: str, where: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of an environment.yml."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise BuildError(f"{where}: the environment.yml is not valid YAML ({str(e).splitlines()[0]})") from None
    conda: list[str] = []
    pip: list[str] = []
    for dep in data.get("dependencies") or []:
        if isinstance(dep, dict):
            pip += [str(p) for p in dep.get("pip") or []]
        else:
            conda.append(str(dep))
    return conda, pip


def _project_target(steps: Sequence[str]) -> str:
    """`.` or `.[extras]`: what a `pip install` step installs of the repository."""
    for step in steps:
        try:
            words = shlex.split(step)
        except ValueError:
            continue
        if "pip" in words and "install" in words:
            for w in words[words.index("install") + 1:]:
                if w == "." or w.startswith(".["):
                    return w
    return "."


def _plan(inst: SWEInstance, ans: dict, mirror: Path, env_commit: str) -> BuildPlan:
    iid = inst.instance_id
    where = f"{iid} ({inst.repo} {inst.version})"
    if "error" in ans:
        raise BuildError(f"{iid}: {ans['error']}")
    specs = ans["specs"]
    python = str(specs.get("python", ""))
    if python.split(".")[:2] != BASE_PYTHON.split("."):
        raise BuildError(f"{where}: SWE-bench's spec needs Python {python or '(none given)'}, and the base image "
                         f"has only Python {BASE_PYTHON} (no conda channel is reachable to install another); "
                         f"only specs with python {BASE_PYTHON} build here — load SWE-bench's prebuilt image instead")
    conda: list[str] = []
    pip_extra: list[str] = []
    packages = str(specs.get("packages", "") or "")
    if ans.get("environment_yml"):
        conda, pip_extra = _environment_yml(ans["environment_yml"], where)
    elif packages and packages not in ("requirements.txt", "environment.yml"):
        conda = shlex.split(packages)
    conda_reqs = [r for r in (conda_to_pip(c, where=where) for c in conda) if r] + pip_extra
    apt, pre = _split_pre_install(specs.get("pre_install") or [], where)
    steps = [s for s in (ans.get("repo_install") or "",) if s] + pre + ([specs["install"]] if specs.get("install") else [])
    image = ans["image"]
    return BuildPlan(
        instance_id=iid, repo=inst.repo, version=inst.version, mirror=mirror, base_commit=inst.base_commit,
        env_commit=env_commit, python=python, base_image=ans["base_image"], env_image=ans["env_image"],
        instance_image=image, also_tag=(inst.image,) if inst.image and inst.image != image else (),
        conda_packages=tuple(conda_reqs), requirements=ans.get("requirements") or "",
        pip_packages=tuple(str(p) for p in specs.get("pip_packages") or []), apt_packages=tuple(apt),
        steps=tuple(steps), project=_project_target(steps))


def plan_builds(instances: Sequence[SWEInstance], repos: Path, *,
                root: Path = CACHE_ROOT) -> list[BuildPlan | BuildError]:
    """For each instance its `BuildPlan`, or the BuildError saying why it cannot be built here. One
    oracle process for all."""
    out: list[BuildPlan | BuildError | None] = []
    rows: list[dict] = []
    todo: list[tuple[int, SWEInstance, Path, str]] = []
    for inst in instances:
        try:
            mirror = find_mirror(repos, inst.repo)
            env_commit = inst.environment_setup_commit or inst.base_commit
            for what, sha in (("base_commit", inst.base_commit), ("environment_setup_commit", env_commit)):
                if not _has_commit(mirror, sha):
                    raise BuildError(f"{inst.instance_id}: the mirror {mirror} does not have its {what} {sha} — "
                                     "update the mirror (`git fetch`)")
        except BuildError as e:
            msg = str(e) if str(e).startswith(inst.instance_id) else f"{inst.instance_id}: {e}"
            out.append(BuildError(msg))
            continue
        row = {k: _plain(v) for k, v in inst.to_swebench().items()}
        row.update(environment_setup_commit=env_commit, mirror=str(mirror))
        todo.append((len(out), inst, mirror, env_commit))
        rows.append(row)
        out.append(None)
    for (i, inst, mirror, env_commit), ans in zip(todo, _oracle_build(rows, root) if rows else [], strict=True):
        try:
            out[i] = _plan(inst, ans, mirror, env_commit)
        except BuildError as e:
            out[i] = e
    return [o for o in out if o is not None]


# ---- packages ---------------------------------------------------------------------------------------


def _host_matches_image() -> bool:
    return sys.version_info[:2] == tuple(int(x) for x in BASE_PYTHON.split(".")) and sys.platform == "linux" \
        and platform.machine() == "x86_64"


class _Wheels:
    """pip download on the host: from the wheels folder (and tasks/swe/wheels) without the network first,
    from PyPI into the wheels folder when that is not enough (unless offline)."""

    def __init__(self, cache: Path, *, offline: bool, log: Callable[[str], None] | None) -> None:
        self.cache, self.offline, self.log = cache, offline, log
        cache.mkdir(parents=True, exist_ok=True)
        self.sources = [cache] + ([TASKS_ROOT / "wheels"] if (TASKS_ROOT / "wheels").is_dir() else [])

    def _pip(self, args: Sequence[str], dest: Path, *, index: bool) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
               "-d", str(dest), *(f"--find-links={s}" for s in self.sources)]
        if not _host_matches_image():
            cmd += ["--only-binary=:all:", "--python-version", BASE_PYTHON, "--implementation", "cp",
                    "--abi", "cp" + BASE_PYTHON.replace(".", ""), "--abi", "abi3", "--abi", "none",
                    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64"]
        if not index:
            cmd.append("--no-index")
        return subprocess.run([*cmd, *args], capture_output=True, text=True)

    def collect(self, args: Sequence[str], dest: Path, *, what: str) -> None:
        """Put what `args` (requirements, `-r FILE`, a project folder) needs into `dest`."""
        if not args:
            return
        fetched = False
        for _ in range(8):
            got = self._pip(args, dest, index=False)
            if got.returncode == 0:
                return
            text = got.stdout + got.stderr
            missing = re.findall(r"No matching distribution found for (\S+)", text)
            if self.offline:
                break
            if not fetched:  # the whole set from PyPI once, then what its sdists need to build
                retry = list(args)
                fetched = True
            elif missing:
                retry = missing
            else:
                break
            if self.log:
                names = " ".join(retry)
                self.log(f"{what}: downloading {names if len(names) < 200 and '-r' not in retry else 'them'} "
                         f"from the package index into {self.cache}")
            online = self._pip(retry, self.cache, index=True)
            if online.returncode != 0:
                text = online.stdout + online.stderr
                break
        errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ERROR")] or text.strip().splitlines()
        where = " or ".join(str(s) for s in self.sources) + (" (offline: the package index is not asked)"
                                                               if self.offline else " or the package index")
        raise BuildError(f"{what}: pip could not get everything from {where}: "
                         f"{errors[-1][:400] if errors else 'pip failed'}")

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
            self.collect(reqs, dest, what=f"{what}: build requirements of {', '.join(p.name for p in sdists)[:200]}")


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
    return _build_requires(text)


def _build_requires(pyproject: str | None) -> list[str]:
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


def _digest_files(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# ---- images -----------------------------------------------------------------------------------------

_BASE_DOCKERFILE = """FROM {base}
USER root
COPY activate /opt/miniconda3/bin/activate
RUN chmod 755 /opt/miniconda3 /opt/miniconda3/bin /opt/miniconda3/bin/activate && mkdir -p /opt/miniconda3/envs
LABEL {layer}=base {hash}={digest}
"""

_ENV_DOCKERFILE = """FROM {base}
USER root
COPY wheels/ {wheels}/
COPY swerl-env/ /tmp/swerl-env/
RUN bash /tmp/swerl-env/setup.sh && rm -rf /tmp/swerl-env {wheels}
LABEL {layer}=env {hash}={digest}
"""

_INSTANCE_DOCKERFILE = """FROM {env}
USER root
COPY --chown=swerl:swerl repo.bundle /tmp/swerl-repo.bundle
COPY wheels/ {wheels}/
COPY install.sh /tmp/swerl-install.sh
USER swerl
RUN set -e; git clone -q --branch main /tmp/swerl-repo.bundle /testbed; cd /testbed; git remote remove origin; \\
    [ "$(git rev-parse HEAD)" = {base_commit} ] || {{ echo "SWERL_BUILD_ERROR: the bundle's main is not base_commit"; exit 3; }}
USER root
RUN bash /tmp/swerl-install.sh && rm -rf /tmp/swerl-install.sh /tmp/swerl-repo.bundle {wheels}
LABEL {layer}=instance swerl.task={task} {hash}={digest}
"""

_PRELUDE = f"""#!/bin/bash
# generated by swerl.envs.swe.build; runs as root in a `docker build` step with no network
set -eo pipefail
fail() {{ echo "SWERL_BUILD_ERROR: $*"; exit 3; }}
export PIP_NO_INDEX=1 PIP_FIND_LINKS={IN_IMAGE_WHEELS} PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off
"""


def _env_setup(plan: BuildPlan, base_tag: str) -> str:
    q = shlex.quote
    lines = [_PRELUDE]
    if plan.apt_packages:
        lines.append(f"""missing=""
for p in {' '.join(q(p) for p in plan.apt_packages)}; do
    dpkg-query -W -f='${{Status}}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
[ -z "$missing" ] || fail {q("SWE-bench's spec apt-installs")}"$missing"\\
{q(f", which {base_tag} does not have (a build has no apt repository): add them to the base image")}
""")
    lines.append(f"""python3 -m venv --without-pip {ENV_DIR}
v=$({ENV_DIR}/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$v" = {BASE_PYTHON} ] || fail "the base image's python3 is $v, not {BASE_PYTHON}"
pip=$(ls {IN_IMAGE_WHEELS}/pip-*.whl 2>/dev/null | sort -V | tail -1)
[ -n "$pip" ] || fail "no pip wheel among the downloaded packages"
{ENV_DIR}/bin/python "$pip/pip" install -q pip
source /opt/miniconda3/bin/activate
conda activate testbed
""")
    what = f"for {plan.repo} {plan.version}"
    if plan.conda_packages:
        lines.append(f"python -m pip install -r /tmp/swerl-env/conda.txt || fail "
                     f"{q(f'pip could not install the spec conda packages {what} from the downloaded packages')}")
    if plan.requirements.strip():
        lines.append(f"python -m pip install -r /tmp/swerl-env/requirements.txt || fail "
                     f"{q(f'pip could not install requirements.txt {what} from the downloaded packages')}")
    if plan.pip_packages:
        lines.append(f"python -m pip install {' '.join(q(p) for p in plan.pip_packages)} || fail "
                     f"{q(f'pip could not install the spec pip_packages {what} from the downloaded packages')}")
    return "\n".join(lines) + "\n"


def _instance_install(plan: BuildPlan) -> str:
    q = shlex.quote
    lines = [_PRELUDE, "cd /testbed", "source /opt/miniconda3/bin/activate", "conda activate testbed"]
    for step in plan.steps:
        lines.append(f"echo {q('+ ' + step)}")
        lines.append(f"{{ {step}\n}} || fail {q(f'the install step `{step}` failed with no network (pip looks only at the downloaded packages)')}")
    lines.append(f"""changed=$(git status --porcelain --untracked-files=no)
if [ -n "$changed" ]; then
    echo "SWERL_BUILD_NOTE: the install changed tracked files, put back to base_commit: $(echo $changed | head -c 300)"
    git checkout -q -- .
fi
mkdir -p .git/info
git ls-files -o --exclude-standard --directory | sed 's|^|/|' >> .git/info/exclude
chown -R swerl:swerl /testbed
[ "$(git rev-parse HEAD)" = {plan.base_commit} ] || fail "HEAD moved during the install"
[ -z "$(git status --porcelain)" ] || fail "/testbed is not clean after the install: $(git status --porcelain | head -5)"
""")
    return "\n".join(lines)


def _image_digest(client: Any, tag: str) -> str | None:
    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return (img.labels or {}).get(LABEL_HASH, "")


def _docker_build(client: Any, tag: str, dockerfile: str, files: dict[str, Path | str], *, where: str,
                  log: Callable[[str], None] | None) -> list[str]:
    """`docker build --network none` of a context: the Dockerfile plus `files` (context path → host file or
    folder, or text). Returns the SWERL_BUILD_NOTE lines; a failed build raises ImageUnavailable (the
    step's own SWERL_BUILD_ERROR message when it gave one: BuildError)."""
    with tempfile.TemporaryFile() as ctx:
        with tarfile.open(fileobj=ctx, mode="w") as tar:
            for name, src in {"Dockerfile": dockerfile, **files}.items():
                if isinstance(src, Path):
                    tar.add(src, arcname=name)
                else:
                    data = src.encode("utf-8", "surrogateescape")
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
        ctx.seek(0)
        out: list[str] = []
        try:
            for chunk in client.api.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, forcerm=True,
                                          decode=True, network_mode="none"):
                if "stream" in chunk:
                    out.append(chunk["stream"])
                if "error" in chunk:
                    text = "".join(out)
                    why = re.findall(r"SWERL_BUILD_ERROR: (.*)", text)
                    if why:
                        raise BuildError(f"{where}: {why[-1].strip()}")
                    raise ImageUnavailable(f"{where}: building {tag} failed: {chunk['error'].strip()}\n{text[-3000:]}")
        except docker.errors.APIError as e:
            raise ImageUnavailable(f"{where}: building {tag} failed: {e}") from e
    text = "".join(out)
    if log:
        log(f"built {tag}")
    return [n.strip() for n in re.findall(r"SWERL_BUILD_NOTE: (.*)", text)]


def _split_tag(image: str) -> tuple[str, str]:
    """`repo:tag` → (repo, tag); no tag (`host:5000/x` has none) → latest."""
    name, sep, tag = image.rpartition(":")
    return (name, tag) if sep and "/" not in tag else (image, "latest")


def _bundle(plan: BuildPlan, work: Path) -> Path:
    """A git bundle of base_commit and its history only (branch main), from the mirror."""
    repo = work / "bundle.git"
    if repo.exists():
        shutil.rmtree(repo)
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, capture_output=True)
    _git(repo, "fetch", "-q", "--no-tags", str(plan.mirror), f"{plan.base_commit}:refs/heads/main")
    out = work / "repo.bundle"
    _git(repo, "bundle", "create", "-q", str(out), "main")
    shutil.rmtree(repo)
    return out


def _checkout(plan: BuildPlan, work: Path) -> Path:
    """base_commit checked out on the host (with its git metadata, for setuptools-scm and friends)."""
    src = work / "src"
    if src.exists():
        shutil.rmtree(src)
    got = subprocess.run(["git", "-c", "safe.directory=*", "clone", "-q", "--shared", "--no-checkout", "--no-tags",
                          str(plan.mirror), str(src)], capture_output=True, text=True)
    if got.returncode != 0:
        raise BuildError(f"{plan.instance_id}: cloning the mirror {plan.mirror} failed: {got.stderr.strip()[-300:]}")
    got = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(src), "checkout", "-q", plan.base_commit],
                         capture_output=True, text=True)
    if got.returncode != 0:
        raise BuildError(f"{plan.instance_id}: checking out {plan.base_commit} failed: {got.stderr.strip()[-300:]}")
    return src


@dataclass
class _EnvBuild:
    tag: str = ""
    digest: str = ""
    wheels: Path | None = None
    error: BaseException | None = None
    built: bool = False
    instances: list[str] = field(default_factory=list)


def build_images(instances: Sequence[SWEInstance], *, repos: Path, wheels: Path = WHEELS_CACHE,
                 offline: bool = False, force: bool = False, client: Any = None,
                 log: Callable[[str], None] | None = print, root: Path = CACHE_ROOT) -> list[BuildResult]:
    """Build SWE-bench's base, environment and instance images of `instances` (see the module
    docstring); one `BuildResult` per instance, in order. Never raises for one instance's problem: its
    result says what it was."""
    client = client or lifecycle.docker_client(timeout=1800)
    try:
        swerl_base = client.images.get(BASE_TAG)
    except docker.errors.ImageNotFound:
        raise ImageUnavailable(f"the base image {BASE_TAG} is missing: run `swerl sandbox build-base` first") from None
    plans = plan_builds(instances, Path(repos), root=root)
    results: dict[str, BuildResult] = {}
    ready: list[BuildPlan] = []
    for inst, plan in zip(instances, plans, strict=True):
        if isinstance(plan, BuildError):
            results[inst.instance_id] = BuildResult(inst.instance_id, error=str(plan), bad_input=True)
            continue
        if not force and _image_digest(client, plan.instance_image) == "":  # there, and not built here
            if log:
                log(f"{plan.instance_image} is on this machine and was not built by swerl: kept (force to rebuild)")
            results[inst.instance_id] = BuildResult(inst.instance_id, instance_image=plan.instance_image)
            continue
        ready.append(plan)
    if not ready:
        return [results[i.instance_id] for i in instances]

    shim = asset("conda_activate.sh")
    base_tag = ready[0].base_image
    base_digest = hashlib.sha256("\0".join([swerl_base.id, shim, _BASE_DOCKERFILE]).encode()).hexdigest()
    built_base = False
    if force or _image_digest(client, base_tag) != base_digest:
        dockerfile = _BASE_DOCKERFILE.format(base=swerl_base.id, layer=LAYER_LABEL, hash=LABEL_HASH, digest=base_digest)
        _docker_build(client, base_tag, dockerfile, {"activate": shim}, where=base_tag, log=log)
        built_base = True
    base_id = client.images.get(base_tag).id
    for other in sorted({plan.base_image for plan in ready} - {base_tag}):  # a spec with docker_specs: same layer
        name, tag = _split_tag(other)
        client.images.get(base_tag).tag(name, tag=tag)

    pip = _Wheels(Path(wheels), offline=offline, log=log)
    envs: dict[str, _EnvBuild] = {}
    with tempfile.TemporaryDirectory(prefix="swerl-build-") as tmp:
        work = Path(tmp)
        for plan in ready:
            iid = plan.instance_id
            built: list[str] = [plan.base_image] if built_base else []
            built_base = False  # reported once, with the first instance built on it
            try:
                env = envs.get(plan.env_image)
                if env is None:
                    env = envs[plan.env_image] = _EnvBuild(tag=plan.env_image)
                    try:
                        env.wheels, env.built = _build_env(client, plan, base_tag, base_id, pip, work, force, log)
                    except (BuildError, ImageUnavailable) as e:
                        env.error = e
                if env.error is not None:
                    raise env.error
                if env.built and not env.instances:
                    built.append(plan.env_image)
                env.instances.append(iid)
                assert env.wheels is not None
                notes, inst_built = _build_instance(client, plan, env.wheels, pip, work, force, log)
                if inst_built:
                    built.append(plan.instance_image)
                for extra in plan.also_tag:
                    name, tag = _split_tag(extra)
                    client.images.get(plan.instance_image).tag(name, tag=tag)
                results[iid] = BuildResult(iid, base_image=plan.base_image, env_image=plan.env_image,
                                           instance_image=plan.instance_image, built=tuple(built), notes=tuple(notes))
            except BuildError as e:
                results[iid] = BuildResult(iid, base_image=plan.base_image, error=str(e), bad_input=True)
            except ImageUnavailable as e:
                results[iid] = BuildResult(iid, base_image=plan.base_image, error=str(e))
    return [results[i.instance_id] for i in instances]


def _build_env(client: Any, plan: BuildPlan, base_tag: str, base_id: str, pip: _Wheels, work: Path, force: bool,
               log: Callable[[str], None] | None) -> tuple[Path, bool]:
    """The environment layer (its wheel set stays in `work` for the instance layers). Returns (wheel
    folder, built)."""
    where = f"{plan.instance_id} ({plan.repo} {plan.version})"
    key = hashlib.sha256(plan.env_image.encode()).hexdigest()[:16]
    folder = work / f"env-{key}"
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    ctx = folder / "swerl-env"
    ctx.mkdir()
    if log:
        log(f"{where}: collecting the packages of {plan.env_image}")
    pip.collect(list(BUILD_TOOLS), wheels, what=f"{where}: pip and the build tools")
    if plan.conda_packages:
        (ctx / "conda.txt").write_text("\n".join(plan.conda_packages) + "\n")
        pip.collect(["-r", str(ctx / "conda.txt")], wheels, what=f"{where}: the spec's conda packages")
    if plan.requirements.strip():
        (ctx / "requirements.txt").write_text(plan.requirements + "\n")
        pip.collect(["-r", str(ctx / "requirements.txt")], wheels, what=f"{where}: requirements.txt")
    if plan.pip_packages:
        pip.collect(list(plan.pip_packages), wheels, what=f"{where}: the spec's pip_packages")
    pip.sdist_build_requires(wheels, what=where)
    setup = _env_setup(plan, base_tag)
    (ctx / "setup.sh").write_text(setup)
    dockerfile = _ENV_DOCKERFILE.format(base=base_id, wheels=IN_IMAGE_WHEELS, layer=LAYER_LABEL, hash=LABEL_HASH,
                                        digest="")
    digest = hashlib.sha256("\0".join([base_id, dockerfile, setup, *(p.read_text() for p in sorted(ctx.iterdir())),
                                       _digest_files(wheels)]).encode()).hexdigest()
    if not force and _image_digest(client, plan.env_image) == digest:
        return wheels, False
    dockerfile = _ENV_DOCKERFILE.format(base=base_id, wheels=IN_IMAGE_WHEELS, layer=LAYER_LABEL, hash=LABEL_HASH,
                                        digest=digest)
    if log:
        log(f"{where}: building {plan.env_image} ({len(list(wheels.iterdir()))} packages)")
    _docker_build(client, plan.env_image, dockerfile, {"wheels": wheels, "swerl-env": ctx}, where=where, log=log)
    return wheels, True


def _build_instance(client: Any, plan: BuildPlan, env_wheels: Path, pip: _Wheels, work: Path, force: bool,
                    log: Callable[[str], None] | None) -> tuple[list[str], bool]:
    """The instance layer. Returns (notes, built)."""
    where = plan.instance_id
    folder = work / f"instance-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    for p in env_wheels.iterdir():
        shutil.copy2(p, wheels / p.name)
    src = _checkout(plan, folder)
    pyproject = src / "pyproject.toml"
    pip.collect(_build_requires(pyproject.read_text() if pyproject.is_file() else None), wheels,
                what=f"{where}: the repository's build requirements")
    pip.collect([f"{src}{plan.project[1:]}"], wheels, what=f"{where}: the repository's dependencies")
    pip.sdist_build_requires(wheels, what=where)
    shutil.rmtree(src)
    env_id = client.images.get(plan.env_image).id
    install = _instance_install(plan)
    template = _INSTANCE_DOCKERFILE.format(env=env_id, wheels=IN_IMAGE_WHEELS, base_commit=plan.base_commit,
                                           layer=LAYER_LABEL, task=plan.instance_id.lower(), hash=LABEL_HASH, digest="")
    digest = hashlib.sha256("\0".join([env_id, template, install, plan.base_commit,
                                       _digest_files(wheels)]).encode()).hexdigest()
    if not force and _image_digest(client, plan.instance_image) == digest:
        return [], False
    bundle = _bundle(plan, folder)
    dockerfile = _INSTANCE_DOCKERFILE.format(env=env_id, wheels=IN_IMAGE_WHEELS, base_commit=plan.base_commit,
                                             layer=LAYER_LABEL, task=plan.instance_id.lower(), hash=LABEL_HASH,
                                             digest=digest)
    if log:
        log(f"{where}: building {plan.instance_image}")
    notes = _docker_build(client, plan.instance_image, dockerfile,
                          {"repo.bundle": bundle, "wheels": wheels, "install.sh": install}, where=where, log=log)
    return notes, True


__all__ = [
    "BASE_PYTHON",
    "WHEELS_CACHE",
    "BuildError",
    "BuildPlan",
    "BuildResult",
    "build_images",
    "conda_to_pip",
    "find_mirror",
    "mirror_candidates",
    "plan_builds",
]
