"""What to build: the build plan of each row (`plan_builds`: the spec's layers, the pre_install steps
split into apt installs and the rest), the shared constants (labels, caches, in-image paths) and
`BuildPlan` / `BuildResult`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swerl.envs.swe.build.conda import _environment_yml, conda_to_pip
from swerl.envs.swe.build.mirrors import _has_commit, find_mirror
from swerl.envs.swe.forms import is_swegym_repo, swegym_image
from swerl.envs.swe.images import CACHE_ROOT
from swerl.envs.swe.resolve import BuildError
from swerl.envs.swe.specs import ORACLE, SPEC_RELEASE, SpecError, _plain, spec_release_dir
from swerl.envs.swe.types import SWEInstance
from swerl.sandbox.images import DEBIAN_SUITE, SUITE_PYTHONS, base_tag

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
    edits: tuple[str, ...] = ()
    """The pre_install steps among `steps` (sed on setup.py, tox.ini, pyproject.toml): run on the host's
    checkout before the repository's dependencies are resolved, as the install step reads what they
    edit (`swerl.envs.swe.build.checkout._apply_edits`)."""

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


def _oracle_build(rows: list[dict], root: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(spec_release_dir(root)), "PYTHONNOUSERSITE": "1"}
    got = subprocess.run([sys.executable, str(ORACLE), "build"], input=json.dumps(rows), capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        raise SpecError(f"swebench {SPEC_RELEASE}'s spec tables failed to load: "
                        f"{tail[-1] if tail else got.returncode}")
    return json.loads(got.stdout)["rows"]


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
        steps=tuple(steps), project=_project_target(steps), edits=tuple(pre))


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


def _split_tag(image: str) -> tuple[str, str]:
    """`repo:tag` → (repo, tag); no tag (`host:5000/x` has none) → latest."""
    name, sep, tag = image.rpartition(":")
    return (name, tag) if sep and "/" not in tag else (image, "latest")
