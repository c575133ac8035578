"""Grading a SWE-bench predictions file (`swerl eval predictions`).

`evaluate_predictions` grades every non-empty prediction in a fresh container (`grade_patch`), `workers` at
a time, writes each result to `out/instances/<id>.json` as soon as it is known (a resumed run reuses the
verdicts whose patch hash matches; a grading that failed for an infrastructure reason is never reused), then
`out/report.json` with the key set of `swebench.harness.reporting.make_run_report` plus `resolve_rate`, and a
Markdown summary `out/report.md`. An infrastructure failure is graded again up to `GradingConfig.retries`
times; a verdict is final.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from swerl.envs.swe.grading import grade_patch, patch_sha256
from swerl.envs.swe.instances import InstanceError
from swerl.envs.swe.types import GradeResult, GradingConfig, Prediction, SWEInstance
from swerl.eval.report import cached_grade, write_report
from swerl.eval.types import EvalSummary
from swerl.files import atomic_write


def evaluate_predictions(instances: Sequence[SWEInstance], predictions: Sequence[Prediction],
                         out_dir: str | Path,
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
        hit = cached_grade(out / "instances" / f"{iid}.json", patch_sha256(p.model_patch))
        if hit is not None:
            results[iid] = hit
        else:
            todo.append(p)

    tries = 1 + max(0, (config or GradingConfig()).retries)

    def work(p: Prediction) -> GradeResult:
        for _ in range(tries):  # an infrastructure failure is graded again; a verdict is final
            r = grade(by_id[p.instance_id], p.model_patch, config=config, log_dir=out / "logs", client=client,
                      run_id=run_id)
            if not r.failed:
                break
        atomic_write(out / "instances" / f"{p.instance_id}.json", r.to_json())
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
                    results[iid] = GradeResult(instance_id=iid, resolved=False, reward=0.0, failure="harness",
                                               error=f"grading crashed: {type(e).__name__}: {e}")
                    atomic_write(out / "instances" / f"{iid}.json", results[iid].to_json())
                r = results[iid]
                bar.update(task, advance=1,
                           description=f"{iid}: {'resolved' if r.resolved else r.status or 'error'}")
    summary = EvalSummary(
        total_instances=len(instances), submitted_ids=tuple(sorted(preds)),
        resolved_ids=tuple(sorted(i for i, r in results.items() if r.resolved)),
        unresolved_ids=tuple(sorted(i for i, r in results.items() if not r.resolved and r.status)),
        empty_patch_ids=tuple(empty),
        error_ids=tuple(sorted(i for i, r in results.items() if not r.status)),
        failed_ids=tuple(sorted(i for i, r in results.items() if r.failed)),
        incomplete_ids=tuple(sorted(set(by_id) - set(preds))), out_dir=str(out))
    write_report(summary, results, out)
    return summary
