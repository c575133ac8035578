"""SWE-bench rows as published: what a row leaves out, derived from SWE-bench's own per-repo /
per-version specs.

The hub rows of SWE-bench, Lite and Verified (and sets in their schema, like SWE-Gym) carry the
task but not how to run its tests: no eval script, log parser, eval type or image name. The
`swebench` release swerl pins for grading (5.x) no longer derives them — its rows must bring an
eval script — so swerl asks the last release with the spec tables, `SPEC_RELEASE`, run in its own
process (`_spec_oracle.py`, its package on that process's path only). Its wheel comes from PyPI
on first use into `.cache/swe/swebench-<release>/`. A repository or version without a spec is a
clear error naming it: nothing is defaulted.

SWE-Gym's rows are in SWE-bench's schema, but its repositories (`swerl.envs.swe.forms.SWEGYM_REPOS`)
have no spec in SWE-bench's tables: SWE-Gym keeps theirs in its own fork of swebench, which
`swerl.envs.swe.forms.derive_swegym` asks the same way.

What a row already has wins: a field is derived only when the row lacks it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from swerl.envs.swe.spec_release import SPEC_RELEASE, SpecError, spec_release_dir

DERIVED = ("eval_script", "log_parser", "eval_type", "image")
"""Row fields a published row may lack and the specs provide."""

ORACLE = Path(__file__).with_name("_spec_oracle.py")


@dataclass(frozen=True)
class DerivedSpec:
    """What SWE-bench's specs say about one instance (see `_spec_oracle.derive`)."""

    eval_script: str
    log_parser: str
    eval_type: str
    image: str
    """The instance image, by SWE-bench's name (`sweb.eval.x86_64.<id>:latest`)."""
    base_image: str
    language: str
    install_repo_script: str
    """Clones the repository at base_commit and installs it (the instance image's layer)."""
    base_dockerfile: str
    python: str
    """The testbed environment's Python version."""


def needs_spec(record: dict) -> bool:
    """A row that cannot be graded as it stands: no eval script (nor swerl's `test_cmd`), or no
    log parser or eval type."""
    has = {f: bool(record.get(f)) for f in (*DERIVED, "test_cmd")}
    return not (has["eval_script"] or has["test_cmd"]) or not has["log_parser"] or not has["eval_type"]


def derive_specs(records: list[dict], *, root: Path | None = None) -> list[DerivedSpec | str]:
    """For each row, its `DerivedSpec`, or a one-line reason it has none (repository or version
    without a spec). One process for all rows."""
    if not records:
        return []
    env = {**os.environ, "PYTHONPATH": str(spec_release_dir(root)), "PYTHONNOUSERSITE": "1"}
    fields = ("instance_id", "repo", "version", "base_commit", "test_patch", "patch", "problem_statement",
              "hints_text", "created_at", "environment_setup_commit", "FAIL_TO_PASS", "PASS_TO_PASS")
    rows = [{k: _plain(r.get(k)) for k in fields if r.get(k) is not None} for r in records]
    got = subprocess.run([sys.executable, str(ORACLE)], input=json.dumps(rows), capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        raise SpecError(f"swebench {SPEC_RELEASE}'s spec tables failed to load: "
                        f"{tail[-1] if tail else got.returncode}")
    answer = json.loads(got.stdout)
    out: list[DerivedSpec | str] = []
    for r in answer["rows"]:
        out.append(r["error"] if "error" in r else DerivedSpec(**r))
    return out


def _plain(value: object) -> object:
    """parquet / datasets hand back numpy arrays for list columns."""
    return value.tolist() if hasattr(value, "tolist") else value


def complete_rows(records: list[dict], *, origin: str, root: Path | None = None) -> list[dict]:
    """The rows with every field `needs_spec` finds missing filled in from the specs (fields a row
    has are kept): SWE-Gym's for the repositories SWE-Gym added (`swerl.envs.swe.forms.SWEGYM_REPOS`),
    SWE-bench's for the others. A row whose repository or version has no spec raises `SpecError`
    naming it."""
    from swerl.envs.swe.forms.oracle import SWEGYM_FORK_COMMIT
    from swerl.envs.swe.forms.swe_gym import derive_swegym, is_swegym_repo

    todo = [i for i, r in enumerate(records) if isinstance(r, dict) and needs_spec(r)]
    if not todo:
        return records
    gym = [i for i in todo if is_swegym_repo(records[i].get("repo"))]
    bench = sorted(set(todo) - set(gym))
    derived: dict[int, DerivedSpec | str] = {}
    derived.update(zip(bench, derive_specs([records[i] for i in bench], root=root), strict=True))
    if gym:
        got = derive_swegym([records[i] for i in gym], root=root)
        derived.update((i, d if isinstance(d, str) else DerivedSpec(**d))
                       for i, d in zip(gym, got, strict=True))
    out = list(records)
    for i in todo:
        rec, d = records[i], derived[i]
        if isinstance(d, str):
            source = (f"SWE-Gym's specs at {SWEGYM_FORK_COMMIT[:12]}" if is_swegym_repo(rec.get("repo"))
                      else f"swebench {SPEC_RELEASE}'s specs")
            raise SpecError(
                f"{origin} record {i} ({rec.get('instance_id')}): {d}, so there is no way to know how to run "
                f"its tests ({source}); give the row eval_script, log_parser, eval_type and image")
        if not rec.get("log_parser"):
            from swerl.envs.swe.parsers import PARSER_REGISTRY

            if d.log_parser not in PARSER_REGISTRY:
                raise SpecError(f"{origin} record {i} ({rec.get('instance_id')}): SWE-bench's spec names the "
                                f"log parser {d.log_parser!r}, which the pinned swebench does not have; give "
                                "the row a log_parser")
        filled = dict(rec)
        for f in DERIVED:
            if not rec.get(f) and not (f == "eval_script" and rec.get("test_cmd")):
                filled[f] = getattr(d, f)
        out[i] = filled
    return out
