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
- **Packages.** Every package a layer installs is resolved by pip for the spec's Python against the
  as-of index (`swerl.envs.swe.pypi`): PyPI as it stood at `RESOLVED_AS_OF`, the day swebench 4.1.0
  was released, whatever day or machine the build runs on, with the user's pip configuration left out
  (`swerl.envs.swe.resolve`). The files are kept in the wheels folder (`--wheels`, default
  `.cache/swe/wheels`), a cache checked by sha256 — what else it holds is never offered to pip — and
  the index's pages in `.cache/swe/pypi`, so `--offline` resolves as online. Builds run with `--network
  none` and install with `pip --no-index` from exactly the resolved files; sdists are built in the image
  from their resolved build requirements. The resolved set is the layer's **lock**, recorded in its
  `swerl.lock` label (`FILE sha256` per line after a `# as-of ...` line) and part of its content hash:
  one instance or fifty, in any order, give the same env image; `build-images --check` resolves again
  with fresh pages and names what differs.
- **Base layer.** swerl's base image of the Debian or Ubuntu suite whose python3 is the spec's Python
  (`SUITE_PYTHONS`: Ubuntu xenial 3.5, bionic 3.6, focal 3.8, jammy 3.10; Debian bullseye 3.9, bookworm
  3.11, trixie 3.13; `swerl sandbox build-base --suite S`, built here by the same debootstrap route when
  missing — Ubuntu's need Ubuntu's archive keyring on the host), not SWE-bench's Ubuntu + Miniconda
  (which needs the network), plus swerl's `conda activate` shim at /opt/miniconda3/bin/activate
  (sandbox/conda_activate.sh). SWE-bench has one base image for every Python (conda brings the Python);
  here the Python comes with the suite, so each suite has its own: bookworm's is SWE-bench's
  `sweb.base.py.x86_64:latest`, another suite's has the suite after the name
  (`sweb.base.py.x86_64.bullseye:latest`). Every layer is labelled with the swerl base it stands on
  (`swerl.base-image`), and the env and instance images keep SWE-bench's names, so eval and training
  find them as they find pulled ones.
- **Environment layer.** A venv at /opt/miniconda3/envs/testbed, the path of SWE-bench's conda env,
  with the base image's python3 — the only Python there is: a spec asking for a version no suite ships
  (3.7, 3.12) is an error naming it and the versions that do build. The venv gets pip, setuptools and
  wheel first, as `conda create python=X` gives SWE-bench's env (`BUILD_TOOLS`). Then, in SWE-bench's
  order: the spec's conda packages (a `packages` list, or an environment.yml's dependencies) installed
  from PyPI under the same names (`name=1.2` meaning `name==1.2.*`); `requirements.txt` from the
  mirror; `pip_packages`. A conda dependency that is not a
  Python package (compilers, C libraries, tools) is an error naming it, as is one PyPI does not have.
- **Instance layer.** The repository at base_commit with its history up to there (a bundle of the
  mirror's base_commit, nothing after it) at /testbed, owned by the sandbox user, on branch `main`;
  then, in SWE-bench's order, the spec's `pre_install` and install steps (`pip install -e .` ...), run
  offline as root in the testbed env. The packages its `apt-get install` steps name are downloaded
  first, with recommended ones as that command installs them, by the env image's own apt in a
  throwaway container on the bridge network (`_fetch_debs`: the suite's archive is reached from this
  machine, never from a build; an Ubuntu suite's with every component listed, as Ubuntu's official
  image lists them; cached in .cache/swe/debs), and installed from those files; `apt-get
  update` / `upgrade` are left out; steps that fetch from the network (wget, curl, git clone) are
  errors; the others (sed on setup.py, locale-gen, ...) run as written. Tracked files the steps
  changed are committed on top of base_commit as SWE-bench's harness commits them (its `SWE-bench`
  setup commit, which the scrub accepts), and reported; without such changes HEAD stays base_commit.
  The untracked files the install made (egg-info, build/) go into .git/info/exclude so the agent's
  diff does not show them.

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
import importlib.metadata
import io
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors

from swerl.envs.swe.forms import is_swegym_repo, swegym_image
from swerl.envs.swe.images import CACHE_ROOT, ImageUnavailable
from swerl.envs.swe.pypi import AsOfIndex
from swerl.envs.swe.resolve import (
    BuildError,
    Resolver,
    build_requires,
    cpython_abi,
    glibc_version,
    host_pip_cert,
    host_python,
    lock_diff,
    lock_digest,
    lock_of,
    manylinux_platforms,
    marker_environment,
    pins,
    run_throwaway,
)
from swerl.envs.swe.specs import ORACLE, SPEC_RELEASE, SpecError, _plain, spec_release_dir
from swerl.sandbox import lifecycle
from swerl.sandbox.errors import SandboxError
from swerl.sandbox.images import (
    DEBIAN_SUITE,
    LABEL_HASH,
    SUITE_PYTHONS,
    base_tag,
    build_base_image,
    distribution,
)
from swerl.sandbox.session import asset
from swerl.structs import SWEInstance

PYTHON_SUITES: dict[str, str] = {py: suite for suite, py in SUITE_PYTHONS.items()}
"""Python version → the Debian or Ubuntu suite whose python3 it is: the versions a testbed env can have
here."""
BASE_IMAGE_LABEL = "swerl.base-image"
"""On every layer built here: the swerl base image (a suite's) the layers stand on."""
WHEELS_CACHE = CACHE_ROOT / "wheels"
"""Default folder of the packages downloaded for builds (`--wheels`): a cache named by content, never a
source of versions (`swerl.envs.swe.pypi`)."""
PAGES_CACHE = CACHE_ROOT / "pypi"
"""The as-of index's pages, filtered by upload time, one folder per cutoff."""
LOCK_LABEL = "swerl.lock"
"""On the env and instance images built here: their lock (`FILE sha256` per line, every file the layer
installed from, after a `# as-of ...` line)."""
DEBS_CACHE = CACHE_ROOT / "debs"
"""The Debian / Ubuntu packages downloaded for specs' pre_install apt steps: one folder per swerl base
and package list (`_fetch_debs`)."""
IN_IMAGE_DEBS = "/tmp/swerl-debs"
LAYER_LABEL = "swerl.swebench-layer"
"""base | env | instance on the images built here."""
ENV_DIR = "/opt/miniconda3/envs/testbed"
IN_IMAGE_WHEELS = "/tmp/swerl-wheels"
BUILD_TOOLS = ("pip", "setuptools", "wheel")
"""What every SWE-bench environment holds before its spec's packages: `conda create -n testbed
python=X` (swebench's `make_env_script_list_py`, Miniconda py311_23.11.0-2 with conda's default
`add_pip_as_python_dependency`) brings pip, which brings setuptools and wheel, at the newest builds for
that Python when the image is built. Here: the newest on PyPI for the spec's Python as of
`RESOLVED_AS_OF` (setuptools 80.9 with pkg_resources from 3.9 on, 59.6 for 3.6, 50.3 for 3.5), installed
first; the spec's own pins (a `setuptools==68.0.0` in pip_packages) come after and win."""
NON_PYTHON_CONDA = frozenset({
    "c-compiler", "cxx-compiler", "fortran-compiler", "compilers", "gcc", "gxx", "gfortran", "clang", "make",
    "cmake", "pkg-config", "nodejs", "yarn", "graphviz", "pandoc", "ffmpeg", "ghostscript", "imagemagick",
    "texlive-core", "tectonic", "git", "mkl", "openblas", "blas", "cudatoolkit", "cudnn", "freetype", "qhull",
    "hdf5", "zlib", "sqlite", "openssl", "icu", "gdal", "proj", "geos", "tk", "xz", "bzip2", "r-base", "go",
    "rust", "curl", "wget", "enchant", "hunspell", "poppler", "cairo", "pango", "boost", "eigen", "libffi",
    "libxml2", "libxslt", "libgdal", "libspatialindex", "libblas", "liblapack", "libgfortran"})
"""Conda packages that are not Python packages (a PyPI project of that name is something else or
nothing): an environment asking for one cannot be made from PyPI."""
_RESOLVER_PIP = importlib.metadata.version("pip")
"""The pip that resolves on the host (in the lock's first line: another resolver may pick otherwise)."""
_NETWORK_STEP = re.compile(r"\b(wget|curl)\b|\bgit\s+(clone|fetch|pull)\b|\bpip\s+download\b")


def buildable_pythons() -> str:
    """`3.9 (bullseye), 3.11 (bookworm), ...`: the Python versions a spec may ask for here."""
    return ", ".join(f"{py} ({suite})"
                     for py, suite in sorted(PYTHON_SUITES.items(),
                                             key=lambda kv: tuple(map(int, kv[0].split(".")))))


def _minor(python: str) -> str:
    return ".".join(python.split(".")[:2])


def suite_base_image(swebench_base: str, suite: str) -> str:
    """The name of SWE-bench's base layer built on `suite`: SWE-bench's own for bookworm, the suite after
    the name otherwise (two suites' layers must not share a name)."""
    if suite == DEBIAN_SUITE:
        return swebench_base
    name, tag = _split_tag(swebench_base)
    return f"{name}.{suite}:{tag}"


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
    """The spec's Python (major.minor)."""
    suite: str
    """The Debian or Ubuntu suite whose python3 that is."""
    swerl_base: str
    """swerl's base image of that suite (`swerl-base:latest`, `swerl-base-bullseye:latest`)."""
    base_image: str
    """SWE-bench's names, from its TestSpec: `sweb.base.py.x86_64:latest` (with the suite after it for
    a suite other than bookworm: `suite_base_image`), ..."""
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
    """Debian / Ubuntu packages the spec's pre_install apt-installs: downloaded on the host side
    (`_fetch_debs`) and installed first in the instance layer, as SWE-bench installs them there."""
    steps: tuple[str, ...]
    """The instance layer's setup, in SWE-bench's order: the repo's install step, pre_install (apt
    steps taken out), install."""
    project: str
    """What the install step installs of the repository (`.`, `.[test]`): its dependencies are
    downloaded too."""

    @property
    def where(self) -> str:
        """The instance and its spec, as messages name them."""
        return f"{self.instance_id} ({self.repo} {self.version})"


@dataclass(frozen=True)
class BuildResult:
    """One instance's images (SWE-bench's names), or why they could not be built."""

    instance_id: str
    base_image: str = ""
    env_image: str = ""
    instance_image: str = ""
    python: str = ""
    swerl_base: str = ""
    """swerl's base image the layers stand on (also their `swerl.base-image` label)."""
    built: tuple[str, ...] = ()
    """Images built by this call (the others were up to date or kept)."""
    notes: tuple[str, ...] = ()
    """What the build noted (tracked files an install step changed, committed as SWE-bench's setup
    commit)."""
    error: str = ""
    bad_input: bool = False
    """The error is the row's or its spec's (unsupported, missing mirror), not the build's."""
    differs: tuple[str, ...] = ()
    """`check` only: how the images differ from the row resolved again (`IMAGE: - FILE`, `IMAGE: + FILE`,
    ...); empty: the same."""

    @property
    def ok(self) -> bool:
        return not self.error


# ---- mirrors ----------------------------------------------------------------------------------------


def _git(git_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    got = subprocess.run(["git", "-c", "safe.directory=*", f"--git-dir={git_dir}", *args],
                         capture_output=True)
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
            got = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(cand), "rev-parse",
                                  "--absolute-git-dir"], capture_output=True, text=True)
            if got.returncode == 0:
                return Path(got.stdout.strip())
    tried = ", ".join(str(c) for c in mirror_candidates(repos, repo)[:3])
    raise BuildError(f"no mirror of {repo} under {repos} (looked for {tried}) — `git clone --mirror "
                     f"https://github.com/{repo} {mirror_candidates(repos, repo)[0]}` on a machine with "
                     "GitHub")


def _has_commit(git_dir: Path, sha: str) -> bool:
    return _git(git_dir, "cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode == 0


# ---- plans ------------------------------------------------------------------------------------------


def _oracle_build(rows: list[dict], root: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(spec_release_dir(root)), "PYTHONNOUSERSITE": "1"}
    got = subprocess.run([sys.executable, str(ORACLE), "build"], input=json.dumps(rows), capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        raise SpecError(f"swebench {SPEC_RELEASE}'s spec tables failed to load: "
                        f"{tail[-1] if tail else got.returncode}")
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
                         "reachable here and PyPI does not have it as such), so this environment cannot be "
                         "built")
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
                raise BuildError(f"{where}: the spec's pre_install step {step!r} fetches from the network, "
                                 "which a build here does not have")
            other.append(text)
    return apt, other


def _environment_yml(text: str, where: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of an environment.yml."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise BuildError(f"{where}: the environment.yml is not valid YAML "
                         f"({str(e).splitlines()[0]})") from None
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
    python = _minor(str(specs.get("python", "") or ""))
    suite = PYTHON_SUITES.get(python)
    if suite is None:
        raise BuildError(f"{where}: SWE-bench's spec needs Python {python or '(none given)'}, which no "
                         "Debian or Ubuntu suite reachable here ships as its python3 (and no conda channel "
                         "is reachable to install it); the versions that build are "
                         f"{buildable_pythons()} — load SWE-bench's prebuilt image instead")
    conda: list[str] = []
    pip_extra: list[str] = []
    packages = str(specs.get("packages", "") or "")
    if ans.get("environment_yml"):
        conda, pip_extra = _environment_yml(ans["environment_yml"], where)
    elif packages and packages not in ("requirements.txt", "environment.yml"):
        conda = shlex.split(packages)
    conda_reqs = [r for r in (conda_to_pip(c, where=where) for c in conda) if r] + pip_extra
    apt, pre = _split_pre_install(specs.get("pre_install") or [], where)
    steps = ([s for s in (ans.get("repo_install") or "",) if s] + pre
             + ([specs["install"]] if specs.get("install") else []))
    image = ans["image"]
    return BuildPlan(
        instance_id=iid, repo=inst.repo, version=inst.version, mirror=mirror, base_commit=inst.base_commit,
        env_commit=env_commit, python=python, suite=suite, swerl_base=base_tag(suite),
        base_image=suite_base_image(ans["base_image"], suite), env_image=ans["env_image"],
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
            if is_swegym_repo(inst.repo):
                raise BuildError(
                    f"{inst.repo} is one of SWE-Gym's repositories, whose specs (SWE-Gym's fork of "
                    "swebench) install from the network at build time (apt, npm, pip -r, git fetch); "
                    "build-images builds from SWE-bench's specs only — load SWE-Gym's prebuilt image "
                    f"{swegym_image(inst.instance_id)} (`docker load`) instead")
            mirror = find_mirror(repos, inst.repo)
            env_commit = inst.environment_setup_commit or inst.base_commit
            for what, sha in (("base_commit", inst.base_commit), ("environment_setup_commit", env_commit)):
                if not _has_commit(mirror, sha):
                    raise BuildError(f"{inst.instance_id}: the mirror {mirror} does not have its {what} "
                                     f"{sha} — update the mirror (`git fetch`)")
        except BuildError as e:
            msg = str(e) if str(e).startswith(inst.instance_id) else f"{inst.instance_id}: {e}"
            out.append(BuildError(msg))
            continue
        row = {k: _plain(v) for k, v in inst.to_swebench().items()}
        row.update(environment_setup_commit=env_commit, mirror=str(mirror))
        todo.append((len(out), inst, mirror, env_commit))
        rows.append(row)
        out.append(None)
    for (i, inst, mirror, env_commit), ans in zip(todo, _oracle_build(rows, root) if rows else [],
                                                  strict=True):
        try:
            out[i] = _plan(inst, ans, mirror, env_commit)
        except BuildError as e:
            out[i] = e
    return [o for o in out if o is not None]


# ---- images -----------------------------------------------------------------------------------------

# in the templates below, a lone backslash ending a line is Python's: it joins the two lines into one of
# the text; a doubled one is the Dockerfile's or the shell's line continuation, kept in the text
_BASE_DOCKERFILE = """FROM {base}
USER root
COPY activate /opt/miniconda3/bin/activate
RUN chmod 755 /opt/miniconda3 /opt/miniconda3/bin /opt/miniconda3/bin/activate \
&& mkdir -p /opt/miniconda3/envs
LABEL {layer}=base {base_label}={swerl_base} {hash}={digest}
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
COPY debs/ {debs}/
COPY install.sh /tmp/swerl-install.sh
USER swerl
RUN set -e; git clone -q --branch main /tmp/swerl-repo.bundle /testbed; cd /testbed; \
git remote remove origin; \\
    [ "$(git rev-parse HEAD)" = {base_commit} ] || \
{{ echo "SWERL_BUILD_ERROR: the bundle's main is not base_commit"; exit 3; }}
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


def _env_setup(plan: BuildPlan, tools: Sequence[str]) -> str:
    """The env layer's script; `tools`: BUILD_TOOLS pinned as resolved (`pip==25.2` ...)."""
    q = shlex.quote
    lines = [_PRELUDE]
    lines.append(f"""python3 -m venv --without-pip {ENV_DIR}
v=$({ENV_DIR}/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$v" = {plan.python} ] || fail "the base image's python3 is $v, not {plan.python}"
pip={IN_IMAGE_WHEELS}/pip-{tools[0].split("==")[1]}-*.whl
pip=$(ls $pip 2>/dev/null | head -1)
[ -n "$pip" ] || fail "no pip wheel among the downloaded packages"
{ENV_DIR}/bin/python "$pip/pip" install -q {' '.join(q(x) for x in tools)} \\
    || fail {q("pip could not install " + ' '.join(tools) + " from the downloaded packages")}
source /opt/miniconda3/bin/activate
conda activate testbed
""")
    what = f"for {plan.repo} {plan.version}"
    if plan.conda_packages:
        lines.append("python -m pip install -r /tmp/swerl-env/conda.txt || fail "
                     + q(f"pip could not install the spec conda packages {what} from the downloaded "
                         "packages"))
    if plan.requirements.strip():
        lines.append(f"python -m pip install -r /tmp/swerl-env/requirements.txt || fail "
                     f"{q(f'pip could not install requirements.txt {what} from the downloaded packages')}")
    if plan.pip_packages:
        lines.append(f"python -m pip install {' '.join(q(p) for p in plan.pip_packages)} || fail "
                     + q(f"pip could not install the spec pip_packages {what} from the downloaded "
                         "packages"))
    return "\n".join(lines) + "\n"


def _instance_install(plan: BuildPlan) -> str:
    q = shlex.quote
    lines = [_PRELUDE]
    if plan.apt_packages:
        # apt resolves the local files against each other and what is installed; the build has no network,
        # so nothing else can come (apt's --no-download refuses local files: "Pathname to install is not
        # absolute")
        lines.append(f"""export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q {IN_IMAGE_DEBS}/*.deb \\
    || fail {q("apt could not install the downloaded packages of the spec's pre_install")}
missing=""
for p in {' '.join(q(p) for p in plan.apt_packages)}; do
    dpkg-query -W -f='${{Status}}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
[ -z "$missing" ] || fail {q("the spec's pre_install apt packages are not installed:")}"$missing"
rm -rf {IN_IMAGE_DEBS} /var/cache/apt/archives/*.deb /var/lib/apt/lists/*
""")
    lines += ["cd /testbed", "source /opt/miniconda3/bin/activate", "conda activate testbed"]
    for step in plan.steps:
        lines.append(f"echo {q('+ ' + step)}")
        lines.append(f"{{ {step}\n}} || fail "
                     + q(f"the install step `{step}` failed with no network (pip looks only at the "
                         "downloaded packages)"))
    lines.append(f"""changed=$(git status --porcelain --untracked-files=no)
if [ -n "$changed" ]; then
    # kept, as SWE-bench's harness keeps them: committed on top of base_commit as its setup commit (sphinx's
    # specs, for one, edit tox.ini so that pytest prints the results its parser reads)
    echo "SWERL_BUILD_NOTE: the install changed tracked files, committed on top of base_commit as \
SWE-bench's setup commit: $(echo $changed | head -c 300)"
    GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z git -c user.name=SWE-bench \
        -c user.email=setup@swebench.config -c commit.gpgsign=false commit -q --no-verify -am SWE-bench
fi
mkdir -p .git/info
git ls-files -o --exclude-standard --directory | sed 's|^|/|' >> .git/info/exclude
chown -R swerl:swerl /testbed
[ "$(git rev-parse HEAD)" = {plan.base_commit} ] || [ "$(git rev-parse HEAD~1)" = {plan.base_commit} ] \
    || fail "HEAD moved during the install"
[ -z "$(git status --porcelain)" ] || \
fail "/testbed is not clean after the install: $(git status --porcelain | head -5)"
""")
    return "\n".join(lines)


def _image_digest(client: Any, tag: str) -> str | None:
    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return (img.labels or {}).get(LABEL_HASH, "")


def _docker_build(client: Any, tag: str, dockerfile: str, files: dict[str, Path | str], *, where: str,
                  log: Callable[[str], None] | None, labels: dict[str, str] | None = None) -> list[str]:
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
                                          decode=True, network_mode="none", labels=labels):
                if "stream" in chunk:
                    out.append(chunk["stream"])
                if "error" in chunk:
                    text = "".join(out)
                    why = re.findall(r"SWERL_BUILD_ERROR: (.*)", text)
                    if why:
                        raise BuildError(f"{where}: {why[-1].strip()}")
                    raise ImageUnavailable(f"{where}: building {tag} failed: {chunk['error'].strip()}\n"
                                           f"{text[-3000:]}")
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


def _ancestor_tags(plan: BuildPlan) -> dict[str, str]:
    """The mirror's tags on base_commit or its history (ref → object): what setuptools-scm and friends read
    the version from (`git describe`), as they would in SWE-bench's full clone. A tag on a later commit
    (the fix's release) is left out: it would bring that commit along."""
    got = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(plan.mirror), "for-each-ref",
                          f"--merged={plan.base_commit}", "--format=%(refname) %(objectname)", "refs/tags"],
                         capture_output=True, text=True)
    if got.returncode != 0:
        raise BuildError(f"{plan.instance_id}: listing the tags of {plan.mirror} failed: "
                         f"{got.stderr.strip()[-300:]}")
    return dict(line.split() for line in got.stdout.splitlines() if line.strip())


def _refspecs(tags: dict[str, str]) -> list[str]:
    return [f"{ref}:{ref}" for ref in tags]


def _bundle(plan: BuildPlan, work: Path, tags: dict[str, str]) -> Path:
    """A git bundle of base_commit and its history only (branch main, and the tags on that history), from
    the mirror."""
    repo = work / "bundle.git"
    if repo.exists():
        shutil.rmtree(repo)
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, capture_output=True)
    _git(repo, "fetch", "-q", "--no-tags", str(plan.mirror), f"{plan.base_commit}:refs/heads/main",
         *_refspecs(tags))
    out = work / "repo.bundle"
    _git(repo, "bundle", "create", "-q", str(out), "refs/heads/main", "--tags")  # (a tag may be named main)
    shutil.rmtree(repo)
    return out


def _checkout(plan: BuildPlan, work: Path, tags: dict[str, str]) -> Path:
    """base_commit checked out on the host (with its git metadata and the tags on its history, for
    setuptools-scm and friends)."""
    src = work / "src"
    if src.exists():
        shutil.rmtree(src)
    got = subprocess.run(["git", "-c", "safe.directory=*", "clone", "-q", "--shared", "--no-checkout",
                          "--no-tags", str(plan.mirror), str(src)], capture_output=True, text=True)
    if got.returncode != 0:
        raise BuildError(f"{plan.instance_id}: cloning the mirror {plan.mirror} failed: "
                         f"{got.stderr.strip()[-300:]}")
    if tags:
        _git(src / ".git", "fetch", "-q", "--no-tags", str(plan.mirror), *_refspecs(tags))
    got = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(src), "checkout", "-q",
                          plan.base_commit], capture_output=True, text=True)
    if got.returncode != 0:
        raise BuildError(f"{plan.instance_id}: checking out {plan.base_commit} failed: "
                         f"{got.stderr.strip()[-300:]}")
    return src


@dataclass
class _EnvBuild:
    wheels: Path | None = None
    error: BaseException | None = None
    built: bool = False
    instances: list[str] = field(default_factory=list)


def build_images(instances: Sequence[SWEInstance], *, repos: Path, wheels: Path = WHEELS_CACHE,
                 offline: bool = False, force: bool = False, check: bool = False, client: Any = None,
                 log: Callable[[str], None] | None = print, root: Path = CACHE_ROOT) -> list[BuildResult]:
    """Build SWE-bench's base, environment and instance images of `instances` (see the module
    docstring); one `BuildResult` per instance, in order. Never raises for one instance's problem: its
    result says what it was. `check`: build nothing; resolve every env and instance layer again from the
    row, with the index's pages asked afresh, and compare its lock and content hash with the image's
    (`BuildResult.differs`)."""
    client = client or lifecycle.docker_client(timeout=1800)
    plans = plan_builds(instances, Path(repos), root=root)
    results: dict[str, BuildResult] = {}
    ready: list[BuildPlan] = []
    for inst, plan in zip(instances, plans, strict=True):
        if isinstance(plan, BuildError):
            results[inst.instance_id] = BuildResult(inst.instance_id, error=str(plan), bad_input=True)
            continue
        if not force and _image_digest(client, plan.instance_image) == "":  # there, and not built here
            if log:
                log(f"{plan.instance_image} is on this machine and was not built by swerl: kept (force to "
                    "rebuild)")
            results[inst.instance_id] = BuildResult(inst.instance_id, instance_image=plan.instance_image)
            continue
        ready.append(plan)
    if not ready:
        return [results[i.instance_id] for i in instances]

    # suite → (its base layer's name, id, built by this call), or why it could not be had: one suite's
    # missing base image (no root for debootstrap) fails only the rows that need it
    bases: dict[str, tuple[str, str, bool] | ImageUnavailable] = {}
    for suite in dict.fromkeys(plan.suite for plan in ready):
        group = [plan for plan in ready if plan.suite == suite]
        try:
            bases[suite] = _build_base(client, group, force and not check, log, check=check)
        except ImageUnavailable as e:
            bases[suite] = e

    resolvers: dict[str, Resolver] = {}
    envs: dict[str, _EnvBuild] = {}
    with tempfile.TemporaryDirectory(prefix="swerl-build-") as tmp, \
            AsOfIndex(Path(wheels), PAGES_CACHE, offline=offline, refresh=check,
                      verify=_verify()) as index:
        work = Path(tmp)
        for plan in ready:
            iid = plan.instance_id
            base = bases[plan.suite]
            if isinstance(base, ImageUnavailable):
                results[iid] = BuildResult(iid, base_image=plan.base_image, python=plan.python,
                                           swerl_base=plan.swerl_base, error=str(base))
                continue
            base_tag, base_id, built_base = base
            built: list[str] = [base_tag] if built_base else []
            # reported once, with the first instance built on it
            bases[plan.suite] = (base_tag, base_id, False)
            differs: list[str] = []
            try:
                pip = resolvers.get(plan.python)
                if pip is None:
                    exe = host_python(plan.python)
                    markers = None if exe else marker_environment(client, base_id)
                    platforms = () if exe else manylinux_platforms(glibc_version(client, base_id))
                    pip = resolvers[plan.python] = Resolver(
                        index, python=plan.python, exe=exe, markers=markers, platforms=platforms,
                        image=None if exe else base_id, client=client, work=work, log=log)
                env = envs.get(plan.env_image)
                if env is None:
                    env = envs[plan.env_image] = _EnvBuild()
                    try:
                        env.wheels, env.built = _build_env(client, plan, base_id, pip, work, force, log,
                                                           differs=differs if check else None)
                    except (BuildError, ImageUnavailable) as e:
                        env.error = e
                if env.error is not None:
                    raise env.error
                if env.built and not env.instances:
                    built.append(plan.env_image)
                env.instances.append(iid)
                assert env.wheels is not None
                notes, inst_built = _build_instance(client, plan, env.wheels, pip, work, force, log,
                                                    differs=differs if check else None)
                if inst_built:
                    built.append(plan.instance_image)
                if not check:
                    for extra in plan.also_tag:
                        name, tag = _split_tag(extra)
                        client.images.get(plan.instance_image).tag(name, tag=tag)
                results[iid] = BuildResult(iid, base_image=plan.base_image, env_image=plan.env_image,
                                           instance_image=plan.instance_image, python=plan.python,
                                           swerl_base=plan.swerl_base, built=tuple(built), notes=tuple(notes),
                                           differs=tuple(differs))
            except BuildError as e:
                results[iid] = BuildResult(iid, base_image=plan.base_image, python=plan.python,
                                           swerl_base=plan.swerl_base, error=str(e), bad_input=True)
            except ImageUnavailable as e:
                results[iid] = BuildResult(iid, base_image=plan.base_image, python=plan.python,
                                           swerl_base=plan.swerl_base, error=str(e))
    return [results[i.instance_id] for i in instances]


def _verify() -> ssl.SSLContext:
    """TLS as this machine's pip has it (its CA bundle: a proxy's, say), for the as-of index's upstream."""
    cert = host_pip_cert()
    return ssl.create_default_context(cafile=cert) if cert else ssl.create_default_context()


def _swerl_base(client: Any, suite: str, log: Callable[[str], None] | None) -> Any:
    """swerl's base image of `suite`, built (debootstrap, as `swerl sandbox build-base --suite`) when
    missing."""
    tag = base_tag(suite)
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        pass
    if log:
        log(f"{tag} ({distribution(suite)} {suite}, Python {SUITE_PYTHONS[suite]}) is missing: building it "
            "(a minute or two)")
    try:
        build_base_image(suite=suite, client=client, log=None)
    except SandboxError as e:
        flag = "" if suite == DEBIAN_SUITE else f" --suite {suite}"
        raise ImageUnavailable(f"the base image {tag} is missing and could not be built "
                               f"({str(e).splitlines()[0]}) — run `sudo swerl sandbox "
                               f"build-base{flag}`") from e
    return client.images.get(tag)


def _build_base(client: Any, plans: Sequence[BuildPlan], force: bool,
                log: Callable[[str], None] | None, *, check: bool = False) -> tuple[str, str, bool]:
    """SWE-bench's base layer on the swerl base of the plans' (one) suite, under every base name they
    have (a spec with docker_specs names its own: the same layer here). Returns (name, id, built).
    `check`: the layer as it is (none: ImageUnavailable)."""
    suite = plans[0].suite
    if check:
        try:
            return plans[0].base_image, client.images.get(plans[0].base_image).id, False
        except docker.errors.ImageNotFound as e:
            raise ImageUnavailable(f"{plans[0].base_image} is not on this machine: nothing to check "
                                   "(build the images first)") from e
    swerl_base = _swerl_base(client, suite, log)
    shim = asset("conda_activate.sh")
    name = plans[0].base_image
    digest = hashlib.sha256("\0".join([swerl_base.id, shim, _BASE_DOCKERFILE,
                                       base_tag(suite)]).encode()).hexdigest()
    built = False
    if force or _image_digest(client, name) != digest:
        dockerfile = _BASE_DOCKERFILE.format(base=swerl_base.id, layer=LAYER_LABEL,
                                             base_label=BASE_IMAGE_LABEL, swerl_base=base_tag(suite),
                                             hash=LABEL_HASH, digest=digest)
        _docker_build(client, name, dockerfile, {"activate": shim}, where=name, log=log)
        built = True
    image = client.images.get(name)
    for other in sorted({plan.base_image for plan in plans} - {name}):
        repo, tag = _split_tag(other)
        image.tag(repo, tag=tag)
    return name, image.id, built


def _build_env(client: Any, plan: BuildPlan, base_id: str, pip: Resolver, work: Path, force: bool,
               log: Callable[[str], None] | None, *, differs: list[str] | None = None) -> tuple[Path, bool]:
    """The environment layer (its wheel set stays in `work` for the instance layers). Returns (wheel
    folder, built). With `differs` nothing is built: how the image's lock and hash differ from this
    resolution goes there."""
    where = plan.where
    key = hashlib.sha256(plan.env_image.encode()).hexdigest()[:16]
    folder = work / f"env-{key}"
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    ctx = folder / "swerl-env"
    ctx.mkdir()
    if log:
        log(f"{where}: resolving the packages of {plan.env_image} as of {pip.index.as_of}")
    pip.collect(list(BUILD_TOOLS), wheels, what=f"{where}: pip and the build tools", binary_only=True)
    tools = pins(wheels, BUILD_TOOLS)
    if plan.conda_packages:
        (ctx / "conda.txt").write_text("\n".join(plan.conda_packages) + "\n")
        pip.collect(["-r", str(ctx / "conda.txt")], wheels, what=f"{where}: the spec's conda packages")
    if plan.requirements.strip():
        (ctx / "requirements.txt").write_text(plan.requirements + "\n")
        pip.collect(["-r", str(ctx / "requirements.txt")], wheels, what=f"{where}: requirements.txt")
    if plan.pip_packages:
        pip.collect(list(plan.pip_packages), wheels, what=f"{where}: the spec's pip_packages")
    pip.sdist_build_requires(wheels, what=where)
    setup = _env_setup(plan, tools)
    (ctx / "setup.sh").write_text(setup)
    lock = _lock_text(pip, lock_of(wheels))
    dockerfile = _ENV_DOCKERFILE.format(base=base_id, wheels=IN_IMAGE_WHEELS, layer=LAYER_LABEL,
                                        hash=LABEL_HASH, digest="")
    digest = hashlib.sha256("\0".join([base_id, dockerfile, setup,
                                       *(p.read_text() for p in sorted(ctx.iterdir())),
                                       lock_digest(lock)]).encode()).hexdigest()
    if differs is not None:
        differs += _compare(client, plan.env_image, digest, lock)
        return wheels, False
    if not force and _image_digest(client, plan.env_image) == digest:
        return wheels, False
    dockerfile = _ENV_DOCKERFILE.format(base=base_id, wheels=IN_IMAGE_WHEELS, layer=LAYER_LABEL,
                                        hash=LABEL_HASH, digest=digest)
    if log:
        log(f"{where}: building {plan.env_image} ({len(lock) - 1} packages)")
    _docker_build(client, plan.env_image, dockerfile, {"wheels": wheels, "swerl-env": ctx}, where=where,
                  log=log, labels={LOCK_LABEL: "\n".join(lock)})
    return wheels, True


def _lock_text(pip: Resolver, files: list[str]) -> list[str]:
    """A layer's lock: what it was resolved against, then its files."""
    return [f"# as-of {pip.index.as_of} python {pip.python} pip-resolver {_RESOLVER_PIP}", *files]


def image_lock(client: Any, image: str) -> list[str] | None:
    """The lock recorded on an image built here (None: no such image, or no lock)."""
    try:
        labels = client.images.get(image).labels or {}
    except docker.errors.ImageNotFound:
        return None
    text = labels.get(LOCK_LABEL)
    return text.splitlines() if text else None


def _compare(client: Any, image: str, digest: str, lock: list[str]) -> list[str]:
    """How `image` differs from a layer resolved again: its hash and its lock, or that it is missing."""
    recorded = image_lock(client, image)
    if recorded is None:
        there = _image_digest(client, image) is not None
        return [f"{image}: {'has no lock (built before locks were recorded)' if there else 'is not built'}"]
    out = [f"{image}: {line}" for line in lock_diff(recorded, lock)]
    if recorded[:1] != lock[:1]:
        out.append(f"{image}: resolved as `{recorded[0]}`, now `{lock[0]}`")
    if not out and _image_digest(client, image) != digest:
        out.append(f"{image}: the same packages, but its build inputs (script, base layer) changed")
    return out


_APT_DOWNLOAD = """set -e
export DEBIAN_FRONTEND=noninteractive
if grep -q '^ID=ubuntu' /etc/os-release; then
    # SWE-bench's base, Ubuntu's official image, lists every component (sphinx's graphviz is in universe);
    # swerl's debootstrapped one lists main (this container only)
    sed -i -E 's/^(deb [^ ]+ [^ ]+) .*/\\1 main restricted universe multiverse/' /etc/apt/sources.list
fi
mkdir -p /out/partial
# apt-get update exits 0 when the archive is out of reach (it warns): that is told apart, exit 90
if ! out=$(apt-get update 2>&1) || printf '%s\\n' "$out" | grep -qE '^(Err|E):|^W: Failed to fetch'; then
    printf '%s\\n' "$out" | grep -E '^(Err|E|W):' | tail -3
    exit 90
fi
apt-get install -y -qq --download-only -o Dir::Cache::archives=/out -o Debug::NoLocking=1 "$@"
rm -rf /out/partial /out/lock
"""


def _fetch_debs(client: Any, image: str, plan: BuildPlan, *, offline: bool,
                log: Callable[[str], None] | None) -> Path:
    """The folder of the .deb files the spec's `apt-get install -y PACKAGES` would install on `image`
    (the env layer: the swerl base's packages are there), recommended packages included as that command
    installs them. They are downloaded by that image's own apt, in a throwaway container on the bridge
    network — the suite's archive is reached from this machine, never from a build — and kept in
    DEBS_CACHE per swerl base and package list."""
    where = plan.where
    key = hashlib.sha256("\0".join([plan.swerl_base, *plan.apt_packages]).encode()).hexdigest()[:16]
    folder = DEBS_CACHE / f"{plan.suite}-{key}"
    done = folder / "packages.json"
    if done.is_file():
        return folder
    if offline:
        raise BuildError(f"{where}: the spec's pre_install apt packages ({' '.join(plan.apt_packages)}) are "
                         f"not downloaded yet ({folder}); run once without --offline")
    if log:
        log(f"{where}: downloading {' '.join(plan.apt_packages)} from {plan.suite}'s archive")
    DEBS_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=DEBS_CACHE))
    try:
        cmd = ["bash", "-c", _APT_DOWNLOAD, "apt-download", *plan.apt_packages]
        code, output = run_throwaway(client, image, cmd, network_mode="bridge",
                                      volumes={str(tmp): {"bind": "/out", "mode": "rw"}})
        output = output.strip()
        if code != 0:
            lines = output.splitlines()
            # apt's error, else its first warning (the fetch that failed, with why)
            errors, warnings = ([ln for ln in lines if ln.startswith(p)] for p in ("E:", "W:"))
            tail = errors or warnings[:1] or lines
            why = (f"{where}: {plan.suite}'s apt could not download the spec's pre_install packages "
                   f"({' '.join(plan.apt_packages)}): {tail[-1] if tail else f'exit {code}'}")
            # a package the suite does not have is the spec's problem; the archive out of reach (90) or
            # anything else, this machine's
            if code != 90 and re.search(r"Unable to locate package|has no installation candidate", output):
                raise BuildError(why)
            raise ImageUnavailable(why)
        files = sorted(p.name for p in tmp.iterdir() if p.suffix == ".deb")
        (tmp / "packages.json").write_text(json.dumps({"packages": list(plan.apt_packages), "files": files},
                                                      indent=1) + "\n")
        try:
            tmp.rename(folder)
        except OSError:  # another build got there first
            if not done.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _build_instance(client: Any, plan: BuildPlan, env_wheels: Path, pip: Resolver, work: Path, force: bool,
                    log: Callable[[str], None] | None, *,
                    differs: list[str] | None = None) -> tuple[list[str], bool]:
    """The instance layer. Returns (notes, built); `differs` as for `_build_env`."""
    where = plan.instance_id
    folder = work / f"instance-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    for p in env_wheels.iterdir():
        shutil.copy2(p, wheels / p.name)
    tags = _ancestor_tags(plan)  # in the repository too: a version from `git describe`
    src = _checkout(plan, folder, tags)
    pyproject = src / "pyproject.toml"
    pip.collect(build_requires(pyproject.read_text() if pyproject.is_file() else None), wheels,
                what=f"{where}: the repository's build requirements")
    pip.collect([f"{src}{plan.project[1:]}"], wheels, what=f"{where}: the repository's dependencies")
    pip.sdist_build_requires(wheels, what=where)
    shutil.rmtree(src)
    try:
        env_id = client.images.get(plan.env_image).id
    except docker.errors.ImageNotFound as e:
        raise ImageUnavailable(f"{where}: {plan.env_image} is not on this machine") from e
    # the cached download goes into the build context as it is (written once, never changed, so its
    # file list stands for its contents)
    if plan.apt_packages:
        debs = _fetch_debs(client, env_id, plan, offline=pip.offline, log=log)
        debs_digest = (debs / "packages.json").read_text()
    else:
        debs = folder / "debs"
        debs.mkdir()
        debs_digest = ""
    install = _instance_install(plan)
    lock = _lock_text(pip, lock_of(wheels))
    template = _INSTANCE_DOCKERFILE.format(env=env_id, wheels=IN_IMAGE_WHEELS, debs=IN_IMAGE_DEBS,
                                           base_commit=plan.base_commit, layer=LAYER_LABEL,
                                           task=plan.instance_id.lower(), hash=LABEL_HASH, digest="")
    digest = hashlib.sha256("\0".join([env_id, template, install, plan.base_commit,
                                       *(f"{ref} {obj}" for ref, obj in sorted(tags.items())),
                                       lock_digest(lock), debs_digest]).encode()).hexdigest()
    if differs is not None:
        differs += _compare(client, plan.instance_image, digest, lock)
        return [], False
    if not force and _image_digest(client, plan.instance_image) == digest:
        return [], False
    bundle = _bundle(plan, folder, tags)
    dockerfile = _INSTANCE_DOCKERFILE.format(env=env_id, wheels=IN_IMAGE_WHEELS, debs=IN_IMAGE_DEBS,
                                             base_commit=plan.base_commit, layer=LAYER_LABEL,
                                             task=plan.instance_id.lower(), hash=LABEL_HASH, digest=digest)
    if log:
        log(f"{where}: building {plan.instance_image}")
    notes = _docker_build(client, plan.instance_image, dockerfile,
                          {"repo.bundle": bundle, "wheels": wheels, "debs": debs, "install.sh": install},
                          where=where, log=log, labels={LOCK_LABEL: "\n".join(lock)})
    return notes, True


__all__ = [
    "BASE_IMAGE_LABEL",
    "LOCK_LABEL",
    "PYTHON_SUITES",
    "WHEELS_CACHE",
    "BuildError",
    "BuildPlan",
    "BuildResult",
    "build_images",
    "buildable_pythons",
    "conda_to_pip",
    "cpython_abi",
    "find_mirror",
    "glibc_version",
    "host_python",
    "image_lock",
    "manylinux_platforms",
    "marker_environment",
    "mirror_candidates",
    "plan_builds",
    "suite_base_image",
]
