"""A training run's log, written and read: metrics.jsonl (always), TensorBoard and W&B (optional), the
live progress line of `swerl train`, and what a user looks at afterwards: one dashboard figure
(`swerl plot`) and a table of headline numbers (`swerl compare`).

Writing (the training loop):

* `MetricsConfig`: the `metrics:` config section (which writers, the progress line).
* `UPDATE_METRICS` / `grouped_update_metrics`: a learner update's fields under their grouped names
  (`actor/loss`, `aem/alpha_mean`, ...; docs/metrics.md); `scalars`: the numeric part of a row.
* `TensorBoardWriter` / `WandbWriter`: each row's scalars to TensorBoard / a W&B run.
  (These: swerl.runlog.writer.)
* `TrainDisplay`: the live line (step, phase, episodes in flight, ETA) when the output is a terminal
  (swerl.runlog.progress).

Reading:

* `read_run` / `read_runs`: a run directory → a `Run` (its name and its metrics rows, by train step);
  `merge_seeds`: the seeds of an arm as one run (swerl.runlog.runs).
* `PANELS`: the dashboard's panels (title, metrics drawn, why a panel can be empty), in one table.
* `build_figure` / `plot_runs`: every run overlaid on every panel, one colour per run, the raw curve
  faint under an exponentially smoothed one (`ema`). (These: swerl.runlog.plot.)
* `compare_runs` / `print_compare`: final and best value of each headline metric, per run
  (swerl.runlog.compare).

The numbers themselves are computed elsewhere (the ActFocus diagnostic: `swerl.algo.diagnostics`).
Only the standard library at import time: matplotlib, rich, tensorboard (through torch) and wandb are
imported when used, so `swerl --help` and the training loop never pay for them. The figure is drawn
on an Agg canvas of its own, never through pyplot, so a caller's pyplot backend and state are left alone.
This package re-exports the names of its modules; code in swerl.runlog's modules imports from the module
that defines a name.
"""

from swerl.runlog.compare import HEADLINE, CompareRow, compare_runs, print_compare
from swerl.runlog.plot import PANELS, Panel, build_figure, ema, plot_runs
from swerl.runlog.progress import TrainDisplay
from swerl.runlog.runs import BAND_MAX, BAND_MIN, PathLike, Run, merge_seeds, read_run, read_runs, seed_group
from swerl.runlog.writer import (
    UPDATE_METRICS,
    MetricsConfig,
    TensorBoardWriter,
    WandbWriter,
    grouped_update_metrics,
    scalars,
)

__all__ = [
    "BAND_MAX", "BAND_MIN", "HEADLINE", "PANELS", "UPDATE_METRICS", "CompareRow", "MetricsConfig", "Panel",
    "PathLike", "Run", "TensorBoardWriter", "TrainDisplay", "WandbWriter", "build_figure", "compare_runs",
    "ema", "grouped_update_metrics", "merge_seeds", "plot_runs", "print_compare", "read_run", "read_runs",
    "scalars", "seed_group",
]
