"""`swerl compare`: the final and best value of the headline metrics (`HEADLINE`) of each run
(`compare_runs`), printed as a rich table or JSON (`print_compare`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from swerl.runlog.runs import PathLike, Run, _as_runs

HEADLINE: tuple[tuple[str, Literal["max", "min"] | None], ...] = (
    ("reward/mean", "max"),
    ("reward/success_rate", "max"),
    ("val/success_rate", "max"),
    ("val/reward_mean", "max"),
    ("actor/entropy", None),
    ("actor/kl", None),
    ("rollout/seq_len_mean", None),
    ("timing_s/step", "min"),
)
"""The metrics `swerl compare` shows, and which way is better (None: neither, only the final value)."""


@dataclass(frozen=True)
class CompareRow:
    """One metric of one run: its last finite value and its best one (the earliest step reaching it).
    None where the run never logged a finite value, or (best) where the metric has no better direction."""

    metric: str
    run: str
    final: float | None
    best: float | None
    best_step: int | None


def compare_runs(run_dirs: Sequence[Run | PathLike]) -> list[CompareRow]:
    """A `CompareRow` per headline metric (in `HEADLINE` order) and run (in the order given)."""
    runs = _as_runs(run_dirs)
    out = []
    for metric, better in HEADLINE:
        for run in runs:
            pts = [(s, v) for s, v in zip(*run.series(metric), strict=True) if math.isfinite(v)]
            final = pts[-1][1] if pts else None
            best = best_step = None
            if pts and better:
                pick = max if better == "max" else min
                best_step, best = pick(pts, key=lambda p: p[1])  # max/min keep the first of equals
            out.append(CompareRow(metric, run.name, final, best, best_step))
    return out


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def print_compare(rows: Sequence[CompareRow], runs: Sequence[Run], json_out: bool = False) -> None:
    """Print `rows` to stdout: a rich table (a row per metric, a column per run, "final (best @step)"), or
    with `json_out` one JSON object {"runs": [...], "metrics": [...]} for scripts."""
    if json_out:
        print(json.dumps({
            "runs": [{"name": r.name, "path": str(r.path), "last_step": r.steps[-1]} for r in runs],
            "metrics": [dataclasses.asdict(row) for row in rows],
        }, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("metric", *(f"{r.name}\n({len(r.rows)} steps, last {r.steps[-1]})" for r in runs),
                  caption="final (best @step): best is the max of reward / val, the min of time")
    cells = {(row.metric, row.run): row for row in rows}
    for metric in dict.fromkeys(row.metric for row in rows):
        line = [metric]
        for r in runs:
            row = cells.get((metric, r.name))
            if row is None or row.final is None:
                line.append("—")
            elif row.best is None:
                line.append(_fmt(row.final))
            else:
                line.append(f"{_fmt(row.final)} ({_fmt(row.best)} @{row.best_step})")
        table.add_row(*line)
    Console().print(table)

