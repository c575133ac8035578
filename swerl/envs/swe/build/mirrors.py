"""The local git mirrors under `--repos`: finding the one of a repository and checking it has a commit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from swerl.envs.swe.resolve import BuildError


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
