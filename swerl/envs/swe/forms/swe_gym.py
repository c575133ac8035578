"""SWE-Gym: its repositories (`SWEGYM_REPOS`), its prebuilt image names, the checkout of its fork of
swebench (`swegym_fork_dir`) and what that fork's spec tables derive for a row of a SWE-Gym repository
(`derive_swegym`, which `swerl.envs.swe.specs.complete_rows` asks).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from swerl.envs.swe.forms.common import _plain
from swerl.envs.swe.forms.oracle import SWEGYM_FORK, SWEGYM_FORK_COMMIT, _run_oracle

SWEGYM_REPOS = frozenset(r.lower() for r in (
    "python/mypy", "getmoto/moto", "conan-io/conan", "dask/dask", "Project-MONAI/MONAI", "iterative/dvc",
    "bokeh/bokeh", "modin-project/modin", "spyder-ide/spyder", "HypothesisWorks/hypothesis",
    "pydantic/pydantic", "pandas-dev/pandas", "facebookresearch/hydra"))
"""The repositories SWE-Gym's fork adds to swebench's spec tables (its swebench/harness/constants.py,
lines 1700-2020, at `SWEGYM_FORK_COMMIT`); none has a spec in SWE-bench's own tables."""

SWEGYM_IMAGE_PREFIX = "xingyaoww/sweb.eval.x86_64."
"""SWE-Gym's prebuilt instance images (its README: "pre-built docker images for each instance under
xingyaoww/sweb.eval.x86_64"), named as OpenHands names them: `__` spelt `_s_`, lower case
(OpenHands evaluation/benchmarks/swe_bench/run_infer.py, `get_instance_docker_image`)."""


def is_swegym_repo(repo: Any) -> bool:
    return isinstance(repo, str) and repo.lower() in SWEGYM_REPOS


def swegym_image(instance_id: str) -> str:
    return f"{SWEGYM_IMAGE_PREFIX}{instance_id.replace('__', '_s_')}:latest".lower()


def swegym_fork_dir(root: Path | None = None) -> Path:
    """A checkout of SWE-Gym's fork of swebench: `SWERL_SWEGYM_FORK`, else the cache, fetched there
    with git at `SWEGYM_FORK_COMMIT` the first time."""
    from swerl.envs.swe.spec_release import SpecError

    def ok(p: Path) -> bool:
        return (p / "swebench" / "harness" / "constants.py").is_file()

    named = os.environ.get("SWERL_SWEGYM_FORK")
    if named:
        if not ok(Path(named)):
            raise SpecError(f"SWERL_SWEGYM_FORK={named} is not a checkout of {SWEGYM_FORK} "
                            "(it has no swebench/harness/constants.py)")
        return Path(named)
    if root is None:
        from swerl.envs.swe.images import CACHE_ROOT as root
    target = root / f"swebench-swegym-{SWEGYM_FORK_COMMIT[:12]}"
    if ok(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        repo = Path(tmp) / "fork"
        steps = (["git", "init", "-q", str(repo)],
                 ["git", "-C", str(repo), "fetch", "-q", "--depth", "1", SWEGYM_FORK, SWEGYM_FORK_COMMIT],
                 ["git", "-C", str(repo), "-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD"])
        for step in steps:
            got = subprocess.run(step, capture_output=True, text=True)
            if got.returncode != 0:
                detail = (got.stderr or got.stdout).strip().splitlines()
                raise SpecError(
                    f"could not fetch SWE-Gym's specs ({SWEGYM_FORK} at {SWEGYM_FORK_COMMIT[:12]}): "
                    f"{detail[-1] if detail else got.returncode}; on a machine without GitHub, clone it "
                    f"elsewhere, check out that commit and copy it to {target} (or point SWERL_SWEGYM_FORK "
                    "at it)")
        if not ok(repo):
            raise SpecError(f"{SWEGYM_FORK} at {SWEGYM_FORK_COMMIT[:12]} has no "
                            "swebench/harness/constants.py")
        try:
            repo.rename(target)
        except OSError:  # another process got there first
            if not ok(target):
                raise
    return target


def derive_swegym(records: list[dict], *, root: Path | None = None) -> list[dict | str]:
    """For each SWE-bench-form row of a SWE-Gym repository: the fields SWE-Gym's fork derives (eval
    script, log parser, eval type, image names, ...) or a one-line reason it has none."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    fork = swegym_fork_dir(root)
    fields = ("instance_id", "repo", "version", "base_commit", "test_patch", "patch", "problem_statement",
              "hints_text", "created_at", "environment_setup_commit", "FAIL_TO_PASS", "PASS_TO_PASS")
    rows = [{k: _plain(r.get(k)) for k in fields if r.get(k) is not None} for r in records]
    answers = _run_oracle("swegym", rows, path=str(fork),
                          extra={"markers": [START_TEST_OUTPUT, END_TEST_OUTPUT]})
    out: list[dict | str] = []
    for row, a in zip(rows, answers, strict=True):
        out.append(a["error"] if "error" in a else {**a, "image": swegym_image(row["instance_id"])})
    return out
