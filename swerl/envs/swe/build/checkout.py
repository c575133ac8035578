"""The repository at base_commit: a bundle of the mirror's history up to it (with the tags on it), and
the checkout the instance layer copies in."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from swerl.envs.swe.build.mirrors import _git
from swerl.envs.swe.build.plan import BuildPlan
from swerl.envs.swe.resolve import BuildError


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
