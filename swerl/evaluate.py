"""Evaluation: grade a SWE-bench predictions file and write SWE-bench's report.

`evaluate_predictions` grades every non-empty prediction in a fresh container (`grade_patch`),
`workers` at a time, writes each result to `out/instances/<id>.json` as soon as it is known
(atomically, so an interrupted run resumes where it stopped: results whose patch hash matches are
reused), and then `out/report.json` with the key set of `swebench.harness.reporting.make_run_report`
plus `resolve_rate`, and a Markdown summary `out/report.md`.

Running an agent (a model or checkpoint) on a split arrives with the rollout engines.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from swerl.envs.swe.grading import grade_patch, patch_sha256
from swerl.envs.swe.instances import InstanceError
from swerl.structs import EvalSummary, GradeResult, GradingConfig, Prediction, SWEInstance

REPORT_SCHEMA_VERSION = 2  # swebench's make_run_report writes this schema


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cached(path: Path, sha: str) -> GradeResult | None:
    if not path.is_file():
        return None
    try:
        r = GradeResult.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None  # a torn or foreign file: grade again
    return r if r.patch_sha256 == sha else None


def evaluate_predictions(instances: Sequence[SWEInstance], predictions: Sequence[Prediction], out_dir: str | Path,
                         *, workers: int = 1, config: GradingConfig | None = None, progress: bool = True,
                         client: Any = None, run_id: str | None = None,
                         grade: Callable[..., GradeResult] = grade_patch) -> EvalSummary:
    """Grade `predictions` against `instances`; see the module docstring."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out = Path(out_dir)
    by_id = {i.instance_id: i for i in instances}
    unknown = sorted(p.instance_id for p in predictions if p.instance_id not in by_id)
    if unknown:
        raise InstanceError(f"predictions name instances that are not in the task set: {', '.join(unknown)}")
    preds = {p.instance_id: p for p in predictions}
    empty = sorted(i for i, p in preds.items() if not (p.model_patch or "").strip())
    results: dict[str, GradeResult] = {}
    todo: list[Prediction] = []
    for iid, p in sorted(preds.items()):
        if iid in empty:
            continue
        hit = _cached(out / "instances" / f"{iid}.json", patch_sha256(p.model_patch))
        if hit is not None:
            results[iid] = hit
        else:
            todo.append(p)

    def work(p: Prediction) -> GradeResult:
        r = grade(by_id[p.instance_id], p.model_patch, config=config, log_dir=out / "logs", client=client,
                  run_id=run_id)
        _atomic_write(out / "instances" / f"{p.instance_id}.json", r.to_json())
        return r

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), disable=not progress) as bar:
        task = bar.add_task("", total=len(todo))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(work, p): p.instance_id for p in todo}
            for fut in as_completed(futures):
                iid = futures[fut]
                try:
                    results[iid] = fut.result()
                except Exception as e:  # a harness bug on one instance must not lose the others' results
                    results[iid] = GradeResult(instance_id=iid, resolved=False, reward=0.0,
                                               error=f"grading crashed: {type(e).__name__}: {e}")
                    _atomic_write(out / "instances" / f"{iid}.json", results[iid].to_json())
                r = results[iid]
                bar.update(task, advance=1, description=f"{iid}: {'resolved' if r.resolved else r.status or 'error'}")
    summary = EvalSummary(
        total_instances=len(instances), submitted_ids=tuple(sorted(preds)),
        resolved_ids=tuple(sorted(i for i, r in results.items() if r.resolved)),
        unresolved_ids=tuple(sorted(i for i, r in results.items() if not r.resolved and r.status)),
        empty_patch_ids=tuple(empty),
        error_ids=tuple(sorted(i for i, r in results.items() if not r.status)),
        incomplete_ids=tuple(sorted(set(by_id) - set(preds))), out_dir=str(out))
    write_report(summary, results, out)
    return summary


def report_dict(summary: EvalSummary, results: dict[str, GradeResult]) -> dict[str, Any]:
    """SWE-bench's run report (same keys as swebench.harness.reporting.make_run_report) + resolve_rate."""
    from swebench.harness.infra_failure import TIER_ENVIRONMENT, classify_logs

    reasons: dict[str, str] = {}
    infra: list[str] = []
    ambiguous: list[str] = []
    for iid in (*summary.unresolved_ids, *summary.error_ids):
        r = results[iid]
        found = classify_logs(r.log_path) if r.log_path else None
        if found:
            reasons[iid] = found[0]
            (infra if found[1] == TIER_ENVIRONMENT else ambiguous).append(iid)
    completed = sorted((*summary.resolved_ids, *summary.unresolved_ids))
    return {
        "total_instances": summary.total_instances,
        "submitted_instances": len(summary.submitted_ids),
        "completed_instances": len(completed),
        "resolved_instances": len(summary.resolved_ids),
        "unresolved_instances": len(summary.unresolved_ids),
        "infra_failure_instances": len(infra),
        "ambiguous_failure_instances": len(ambiguous),
        "empty_patch_instances": len(summary.empty_patch_ids),
        "error_instances": len(summary.error_ids),
        "completed_ids": completed,
        "incomplete_ids": list(summary.incomplete_ids),
        "empty_patch_ids": list(summary.empty_patch_ids),
        "submitted_ids": list(summary.submitted_ids),
        "resolved_ids": list(summary.resolved_ids),
        "unresolved_ids": list(summary.unresolved_ids),
        "infra_failure_ids": sorted(infra),
        "ambiguous_failure_ids": sorted(ambiguous),
        "failure_reasons": dict(sorted(reasons.items())),
        "error_ids": list(summary.error_ids),
        "schema_version": REPORT_SCHEMA_VERSION,
        "resolve_rate": summary.resolve_rate,
    }


def write_report(summary: EvalSummary, results: dict[str, GradeResult], out: Path) -> None:
    report = report_dict(summary, results)
    _atomic_write(out / "report.json", json.dumps(report, indent=2) + "\n")
    lines = ["# Evaluation report", "",
             f"**Resolved {report['resolved_instances']} / {report['total_instances']}** "
             f"(resolve rate {100 * report['resolve_rate']:.1f}%)", "",
             "| count | value |", "|---|---|"]
    for k in ("total_instances", "submitted_instances", "completed_instances", "resolved_instances",
              "unresolved_instances", "empty_patch_instances", "error_instances"):
        lines.append(f"| {k} | {report[k]} |")
    lines += ["", "| instance | result | FAIL_TO_PASS ok | PASS_TO_PASS ok | seconds | note |",
              "|---|---|---|---|---|---|"]
    for iid in summary.submitted_ids:
        if iid in summary.empty_patch_ids:
            lines.append(f"| {iid} | empty patch | | | | |")
            continue
        r = results[iid]
        res = "resolved" if r.resolved else ("unresolved" if r.status else "error")
        f2p = f"{len(r.fail_to_pass_success)}/{len(r.fail_to_pass_success) + len(r.fail_to_pass_failure)}"
        p2p = f"{len(r.pass_to_pass_success)}/{len(r.pass_to_pass_success) + len(r.pass_to_pass_failure)}"
        note = r.error.splitlines()[0][:120].replace("|", "\\|") if r.error else ""
        lines.append(f"| {iid} | {res} | {f2p} | {p2p} | {r.total_s:.1f} | {note} |")
    _atomic_write(out / "report.md", "\n".join(lines) + "\n")
