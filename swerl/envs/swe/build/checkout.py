"""The repository at base_commit: a bundle of the mirror's history up to it (with the tags on it), and
the checkout on the host its dependencies are resolved from, edited as the spec's pre_install edits it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import docker.errors

from swerl.envs.swe.build.mirrors import _git
from swerl.envs.swe.build.plan import BuildPlan
from swerl.envs.swe.image_build import ImageUnavailable
from swerl.envs.swe.resolve import BuildError, host_user, run_throwaway


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


def _apply_edits(client: Any, image: str, plan: BuildPlan, src: Path) -> None:
    """The spec's pre_install steps (`plan.edits`) run on the checkout `src`, in a throwaway container of
    `image` (the env layer) with no network, as this machine's user: sphinx's specs pin Jinja2<3.0 and
    markupsafe<=2.0.1 in setup.py, astropy's a setuptools in pyproject.toml, and the packages downloaded
    for the install must be the ones the edited files ask for. A step that fails here (one that needs
    root or an apt package: django's locale-gen) is let be: the checkout only feeds the resolution, and
    the instance layer runs every step again on its own clone, where a failure stops the build."""
    if not plan.edits:
        return
    script = "\n".join(["cd /testbed", "source /opt/miniconda3/bin/activate && conda activate testbed",
                        *(f"( {step}\n) >/dev/null 2>&1 || true" for step in plan.edits)])
    try:
        code, output = run_throwaway(client, image, ["bash", "-c", script], network_mode="none",
                                      environment={"HOME": "/tmp"}, user=host_user(),
                                      volumes={str(src.resolve()): {"bind": "/testbed", "mode": "rw"}})
    except docker.errors.DockerException as e:
        raise ImageUnavailable(f"{plan.instance_id}: running the spec's pre_install edits in {image} "
                               f"failed: {e}") from e
    if code != 0:
        raise ImageUnavailable(f"{plan.instance_id}: the spec's pre_install edits could not be run in "
                               f"{image} (exit {code}): {output.strip()[-300:]}")
