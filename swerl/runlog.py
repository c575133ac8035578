"""A training run's log, written and read: metrics.jsonl (always), TensorBoard and W&B (optional), the
live progress line of `swerl train`, and what a user looks at afterwards: one dashboard figure
(`swerl plot`) and a table of headline numbers (`swerl compare`).

Writing (the training loop):

* `MetricsConfig`: the `metrics:` config section (which writers, the progress line).
* `UPDATE_METRICS` / `grouped_update_metrics`: a learner update's fields under their grouped names
  (`actor/loss`, `aem/alpha_mean`, ...; docs/metrics.md); `scalars`: the numeric part of a row.
* `TensorBoardWriter` / `WandbWriter`: each row's scalars to TensorBoard / a W&B run.
* `TrainDisplay`: the live line (step, phase, episodes in flight, ETA) when the output is a terminal.

Reading:

* `read_run` / `read_runs`: a run directory → a `Run` (its name and its metrics rows, by train step).
* `PANELS`: the dashboard's panels (title, metrics drawn, why a panel can be empty), in one table.
* `build_figure` / `plot_runs`: every run overlaid on every panel, one colour per run, the raw curve
  faint under an exponentially smoothed one (`ema`).
* `compare_runs` / `print_compare`: final and best value of each headline metric, per run.

The numbers themselves are computed elsewhere (the ActFocus diagnostic: `swerl.algo.diagnostics`).
Only the standard library at import time: matplotlib, rich, tensorboard (through torch) and wandb are
imported when used, so `swerl --help` and the training loop never pay for them. The figure is drawn
on an Agg canvas of its own, never through pyplot, so a caller's pyplot backend and state are left alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import secrets
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from rich.console import Console
    from rich.progress import Progress

PathLike = str | os.PathLike[str]
_NAN = float("nan")
_METRICS_FILE = "metrics.jsonl"
_HINT = f"a training run writes <run_dir>/{_METRICS_FILE}"


# ---- reading runs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One training run: its display name, its directory and its metrics rows in train-step order."""

    name: str
    path: Path
    rows: tuple[dict[str, Any], ...]

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(r["train_step"] for r in self.rows)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) over the rows that hold `key`. A null, NaN or non-numeric value is NaN (a gap);
        a row without the key is left out (the metric was not logged on that step, e.g. `val/` keys off
        the evaluation steps)."""
        steps, values = [], []
        for r in self.rows:
            if key in r:
                steps.append(r["train_step"])
                values.append(_number(r[key]))
        return steps, values

    def has(self, key: str) -> bool:
        """Whether any row holds a finite value of `key`."""
        return any(math.isfinite(v) for v in self.series(key)[1])


def _number(v: Any) -> float:
    # bools are ints to Python but flags in a metrics row, not curves
    if isinstance(v, bool) or not isinstance(v, int | float):
        return _NAN
    return float(v)


def read_run(run_dir: PathLike) -> Run:
    """The run in `run_dir`, named after the directory. Undecodable lines (a torn last line of a killed
    run) are skipped, as are rows without an integer `train_step`; a step logged twice keeps its last
    row. FileNotFoundError when there is no metrics file, ValueError when it has no rows."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {path} ({_HINT})")
    file = path / _METRICS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no metrics file at {file} ({_HINT})")
    by_step: dict[int, dict[str, Any]] = {}
    for line in file.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            step = row.get("train_step")
            if isinstance(step, int) and not isinstance(step, bool):
                by_step[step] = row
    if not by_step:
        raise ValueError(f"{file} has no metrics rows (rows are JSON objects with an integer train_step)")
    return Run(name=path.resolve().name, path=path, rows=tuple(by_step[s] for s in sorted(by_step)))


def read_runs(run_dirs: Sequence[PathLike]) -> list[Run]:
    """`read_run` of each directory; runs whose directories share a name are told apart by as many
    parent folders as it takes (`a/run` vs `b/run`)."""
    runs = [read_run(d) for d in run_dirs]
    resolved = [r.path.resolve() for r in runs]
    for i, p in enumerate(resolved):
        if p in resolved[:i]:
            raise ValueError(f"run {runs[i].path} is given twice")
    names = _distinct_names(resolved)
    return [dataclasses.replace(r, name=n) for r, n in zip(runs, names, strict=True)]


def _distinct_names(paths: Sequence[Path]) -> list[str]:
    depth = [1] * len(paths)
    while True:
        names = ["/".join(p.parts[-d:]) if d < len(p.parts) else str(p)
                 for p, d in zip(paths, depth, strict=True)]
        clash = [i for i, n in enumerate(names) if names.count(n) > 1 and depth[i] < len(paths[i].parts)]
        if not clash:
            return names
        for i in clash:
            depth[i] += 1


_SEED = re.compile(r"^(?:seed|s)?(\d+)$|^(.+?)[-_.](?:seed|s)(\d+)$", re.I)
BAND_MIN, BAND_MAX = ":min", ":max"
"""Suffixes of the per-step minimum and maximum over seeds in a `merge_seeds` run (`reward/mean:min`)."""


def seed_group(path: Path) -> Path | None:
    """The arm a seed's run directory belongs to, or None when its name names no seed: `…/ARM/seed3`,
    `…/ARM/s3` and `…/ARM/3` belong to `…/ARM`; `…/ARM-seed3`, `…/ARM_s3` to `…/ARM`."""
    m = _SEED.match(path.name)
    if m is None:
        return None
    return path.parent if m.group(1) is not None else path.parent / m.group(2)


def merge_seeds(runs: Sequence[Run]) -> list[Run]:
    """Runs that differ only in their seed (`seed_group`) as one run each, in first-seen order: at every
    step all of them logged, each numeric metric's mean over the seeds, with its minimum and maximum
    under `<key>:min` / `<key>:max` (the dashboard shades that band). A run without a seed in its name
    stays as it is. Named `<arm> (n seeds)`."""
    groups: dict[Path, list[Run]] = {}
    for r in runs:
        key = seed_group(r.path.resolve())
        groups.setdefault(key if key is not None else r.path.resolve(), []).append(r)
    names = _distinct_names(list(groups))
    out = []
    for (path, members), name in zip(groups.items(), names, strict=True):
        if len(members) == 1 and seed_group(members[0].path.resolve()) is None:
            out.append(members[0])
            continue
        by_step = [{row["train_step"]: row for row in m.rows} for m in members]
        rows = []
        for step in sorted(set.intersection(*(set(b) for b in by_step))):
            at = [b[step] for b in by_step]
            row: dict[str, Any] = {"train_step": step}
            for k in dict.fromkeys(k for a in at for k in a):
                vals = [_number(a.get(k)) for a in at]
                if k == "train_step" or not all(math.isfinite(v) for v in vals):
                    continue
                row[k] = sum(vals) / len(vals)
                row[k + BAND_MIN], row[k + BAND_MAX] = min(vals), max(vals)
            rows.append(row)
        if not rows:
            raise ValueError(f"the seeds of {path} share no logged step")
        out.append(Run(name=f"{name} ({len(members)} seeds)", path=path, rows=tuple(rows)))
    return out


def _as_runs(runs: Sequence[Run | PathLike]) -> list[Run]:
    if all(isinstance(r, Run) for r in runs):
        return list(runs)  # type: ignore[arg-type]
    return read_runs([r.path if isinstance(r, Run) else r for r in runs])


# ---- smoothing -------------------------------------------------------------------------------------


def ema(values: Sequence[float | None], smooth: float) -> list[float]:
    """Exponential moving average, s_t = smooth · s_(t-1) + (1 − smooth) · x_t, starting at the first
    value (TensorBoard's smoothing without its debiasing). smooth=0 returns the values.

    None / NaN / ±inf are gaps: NaN in the output, and the average carries over them unchanged, so one
    undefined step does not blank the rest of the curve."""
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smooth}")
    out: list[float] = []
    state: float | None = None
    for v in values:
        x = _number(v)
        if not math.isfinite(x):
            out.append(_NAN)
            continue
        state = x if state is None else smooth * state + (1.0 - smooth) * x
        out.append(state)
    return out


# ---- the dashboard ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """One panel of the dashboard."""

    title: str
    keys: tuple[str, ...]
    """metrics.jsonl keys drawn as curves (one line style per key, one colour per run)."""
    empty: str | None = None
    """Shown when no run has any of the keys (None: "no data for <keys>")."""
    ylabel: str = ""
    key_prefix: str | None = None
    """Also draw the keys starting with this that some run holds, the first and last in natural order
    only (val/pass@1 and val/pass@k for whatever k was run: every k between would bury the panel)."""
    band: tuple[str, str] | None = None
    """(low key, high key): a shaded band per run under the first key's curve."""
    sparse: bool = False
    """Logged on some steps only (evaluation): points joined across the steps they exist on, unsmoothed,
    since an evaluation is already an average and there are few of them."""

    def empty_text(self) -> str:
        return self.empty or f"no data for {', '.join(self.keys)}"


PANELS: tuple[Panel, ...] = (
    Panel("reward / success (train)", ("reward/mean", "reward/success_rate"),
          "no reward/ metrics in these runs"),
    Panel("held-out (val)", ("val/success_rate", "val/reward_mean"), "no val/ metrics: set eval_every",
          key_prefix="val/pass@", sparse=True),
    Panel("policy entropy", ("actor/entropy",), ylabel="nats / token"),
    Panel("response length", ("rollout/seq_len_mean",), ylabel="tokens / episode"),
    Panel("turns per episode", ("rollout/turns_mean",), ylabel="turns"),
    Panel("AEM α range", ("aem/alpha_mean",), "AEM off in these runs (no aem/ metrics)",
          ylabel="α (band: min–max)", band=("aem/alpha_min", "aem/alpha_max")),
    Panel("ActFocus weights", ("actfocus/weight_action", "actfocus/weight_reasoning"),
          "ActFocus off in these runs (no actfocus/weight_* metrics)", ylabel="token weight"),
    Panel("energy diagnostic", ("actfocus/energy_action", "actfocus/energy_reasoning"),
          "no reference energy (ActFocus off: no actfocus/energy_* metrics)", ylabel="reference energy"),
    Panel("corr(action energy, reward variance)", ("actfocus/energy_reward_corr_spearman",),
          "no correlation: ActFocus off, or under 3 groups with action tokens per step",
          ylabel="Spearman ρ across groups"),
    Panel("KL", ("actor/kl", "actor/approx_kl"), ylabel="KL"),
    Panel("clip fraction", ("actor/clipfrac_low", "actor/clipfrac_high"), ylabel="fraction of tokens"),
    Panel("time per step", ("timing_s/rollout", "timing_s/learn", "timing_s/sync", "timing_s/eval"),
          ylabel="seconds"),
)
"""The dashboard, in reading order (filled row by row, `_COLS` panels a row)."""

_COLS = 3
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_RAW_ALPHA = 0.25
_MARK_BELOW = 60  # raw points get a marker on short runs, so a finite value between gaps still shows


def _panel_keys(panel: Panel, runs: Sequence[Run]) -> list[str]:
    keys = list(panel.keys)
    if panel.key_prefix:
        found = {k for r in runs for row in r.rows for k in row if k.startswith(panel.key_prefix)}
        extra = sorted(found - set(keys), key=_natural)
        keys += extra[:1] + extra[-1:] if len(extra) > 1 else extra
    return keys


def _natural(key: str) -> tuple[str, int, str]:
    # val/pass@10 after val/pass@2
    head = key.rstrip("0123456789")
    tail = key[len(head):]
    return (head, int(tail) if tail else -1, key)


def build_figure(runs: Sequence[Run], smooth: float = 0.6) -> Figure:
    """The dashboard of `runs` as a matplotlib Figure on an Agg canvas (the caller saves or inspects it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if not runs:
        raise ValueError("no runs to plot")
    ema([], smooth)  # validates smooth before any drawing
    rows = math.ceil(len(PANELS) / _COLS)
    header_in, panel_in = 0.6, 3.3
    fig = Figure(figsize=(5.2 * _COLS, panel_in * rows + header_in), layout="constrained")
    FigureCanvasAgg(fig)
    # a header of its own for the title and the run legend: constrained layout stacks a suptitle and an
    # "outside" figure legend on top of each other
    header, body = fig.subfigures(2, 1, height_ratios=(header_in, panel_in * rows))
    axes = body.subplots(rows, _COLS, squeeze=False).ravel()
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for ax, panel in zip(axes, PANELS, strict=False):
        _draw_panel(ax, panel, runs, colours, smooth)
    for ax in axes[len(PANELS):]:
        ax.set_axis_off()
    how = f"EMA smoothing {smooth:g}, raw values faint" if smooth > 0 else "unsmoothed"
    fig.suptitle(f"training runs: {', '.join(r.name for r in runs)}   ({how})", fontsize="x-large")
    handles = [Line2D([], [], color=c, lw=2.5, label=r.name) for r, c in zip(runs, colours, strict=True)]
    header.legend(handles=handles, loc="lower center", ncols=min(len(runs), 6), frameon=False,
                  fontsize="large")
    return fig


def _draw_panel(ax: Axes, panel: Panel, runs: Sequence[Run], colours: Sequence[str], smooth: float) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ax.set_title(panel.title, fontsize="medium", fontweight="bold")
    keys = _panel_keys(panel, runs)
    drawn_keys = [k for k in keys if any(r.has(k) for r in runs)]
    if not drawn_keys:
        # textwrap, not wrap=True: matplotlib wraps at the figure's edge, not the panel's
        ax.text(0.5, 0.5, textwrap.fill(panel.empty_text(), 38), ha="center", va="center", color="0.35",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_facecolor("0.97")
        for spine in ax.spines.values():
            spine.set_color("0.8")
        return
    without: list[str] = []
    for run, colour in zip(runs, colours, strict=True):
        drew = False
        if panel.band:
            drew |= _draw_band(ax, run, panel.band, colour)
        for j, key in enumerate(keys):
            if key in drawn_keys and run.has(key + BAND_MIN):
                _draw_band(ax, run, (key + BAND_MIN, key + BAND_MAX), colour, join=panel.sparse)
            if key in drawn_keys:
                drew |= _draw_series(ax, run, key, colour, _LINESTYLES[j % len(_LINESTYLES)],
                                     _MARKERS[j % len(_MARKERS)] if panel.sparse else None, smooth)
        if not drew:
            without.append(run.name)
    if len(keys) > 1:
        # colours name the runs (the figure legend); line styles name the metrics here
        ax.legend(handles=[Line2D([], [], color="0.3", ls=_LINESTYLES[keys.index(k) % len(_LINESTYLES)],
                                  marker=_MARKERS[keys.index(k) % len(_MARKERS)] if panel.sparse else None,
                                  label=k) for k in drawn_keys],
                  fontsize="x-small", loc="best", framealpha=0.7)
    if without:
        ax.text(0.99, 0.01, f"no data: {', '.join(without)}", ha="right", va="bottom", fontsize="x-small",
                color="0.4", transform=ax.transAxes)
    ax.set_xlabel("train step", fontsize="small")
    if panel.ylabel or len(drawn_keys) == 1:
        ax.set_ylabel(panel.ylabel or drawn_keys[0], fontsize="small")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize="small")
    ax.grid(alpha=0.3)


def _draw_series(ax: Axes, run: Run, key: str, colour: str, ls: str, marker: str | None,
                 smooth: float) -> bool:
    steps, values = run.series(key)
    if not any(math.isfinite(v) for v in values):
        return False
    if marker is not None:  # sparse: join the points that exist
        pts = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, ls=ls, marker=marker, ms=4, lw=1.4)
        return True
    mark = "." if len(steps) < _MARK_BELOW else None
    if smooth > 0:
        ax.plot(steps, values, color=colour, ls=ls, lw=1.0, alpha=_RAW_ALPHA, marker=mark, ms=3)
        ax.plot(steps, ema(values, smooth), color=colour, ls=ls, lw=1.7)
    else:
        ax.plot(steps, values, color=colour, ls=ls, lw=1.4, marker=mark, ms=3)
    return True


def _draw_band(ax: Axes, run: Run, band: tuple[str, str], colour: str, join: bool = False) -> bool:
    lo_key, hi_key = band
    lo = dict(zip(*run.series(lo_key), strict=True))
    hi = dict(zip(*run.series(hi_key), strict=True))
    steps = sorted(s for s in lo.keys() & hi.keys() if math.isfinite(lo[s]) and math.isfinite(hi[s]))
    if not steps:
        return False
    # a missing step splits the band rather than bridging it, unless the metric is sparse (`join`:
    # logged on evaluation steps only, joined across them as its curve is)
    full = steps if join else list(range(steps[0], steps[-1] + 1))
    ax.fill_between(full, [lo.get(s, _NAN) for s in full], [hi.get(s, _NAN) for s in full], color=colour,
                    alpha=0.15, lw=0)
    return True


def plot_runs(run_dirs: Sequence[PathLike], out: PathLike, fmt: Literal["png", "svg"] = "png",
              smooth: float = 0.6, seeds: bool = False) -> Path:
    """Write the dashboard of the runs in `run_dirs` to `out` (a .png or .svg file; `.<fmt>` is added
    when `out` has no suffix) and return the path written. `seeds`: one curve per arm, the mean over its
    seeds with the min–max band shaded (`merge_seeds`)."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"format must be png or svg, got {fmt!r}")
    out = Path(out)
    if not out.suffix:
        out = out.with_name(f"{out.name}.{fmt}")
    elif out.suffix.lower() != f".{fmt}":
        raise ValueError(f"{out} does not end in .{fmt} (give --format {out.suffix.lstrip('.').lower()} "
                         f"for that file, or name a .{fmt} file)")
    import matplotlib

    runs = read_runs(run_dirs)
    fig = build_figure(merge_seeds(runs) if seeds else runs, smooth)
    out.parent.mkdir(parents=True, exist_ok=True)
    # SVG text as <text> rather than glyph outlines: searchable, selectable and a smaller file
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(out, format=fmt, dpi=110)
    return out


# ---- comparing runs --------------------------------------------------------------------------------

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


# ---- writing a run: the metrics config, metric names, TensorBoard, W&B -------------------------------


@dataclass(frozen=True)
class MetricsConfig:
    """Where each step's metrics row goes: <run_dir>/metrics.jsonl always, TensorBoard optionally."""

    tensorboard: bool = False
    """Also write each step's metrics as TensorBoard scalars to <run_dir>/tensorboard
    (`tensorboard --logdir <run_dir>/tensorboard`)."""
    wandb: bool = False
    """Also log each step's metrics to Weights & Biases (`pip install 'swerl[wandb]'`)."""
    wandb_project: str = "swerl"
    """W&B project."""
    wandb_mode: str = "online"
    """W&B mode: online, offline (files under <run_dir>/wandb, `wandb sync` later) or disabled."""
    progress: bool = True
    """Live progress line (step, phase, episodes in flight, ETA) when the output is a terminal."""

    def __post_init__(self) -> None:
        if self.wandb_mode not in ("online", "offline", "disabled"):
            raise ValueError("metrics.wandb_mode must be online, offline or disabled, got "
                             f"{self.wandb_mode!r}")


UPDATE_METRICS: dict[str, str] = {
    # actor/: the policy update
    "loss": "actor/loss", "pg_loss": "actor/pg_loss", "kl": "actor/kl", "approx_kl": "actor/approx_kl",
    "clipfrac_low": "actor/clipfrac_low", "clipfrac_high": "actor/clipfrac_high",
    "clipfrac_dual": "actor/clipfrac_dual", "grad_norm": "actor/grad_norm", "entropy": "actor/entropy",
    "lr": "actor/lr", "advantage_mean": "actor/advantage_mean",
    "advantage_abs_mean": "actor/advantage_abs_mean", "tokens": "actor/tokens",
    "tokens_per_s": "actor/tokens_per_s", "micro_batches": "actor/micro_batches",
    "optimizer_steps": "actor/optimizer_steps", "step": "actor/optimizer_step", "episodes": "actor/episodes",
    "episodes_kept": "actor/episodes_kept", "skipped": "actor/skipped",
    # reward/: what the batch earned
    "reward_mean": "reward/mean", "reward_shaped_mean": "reward/shaped_mean",
    # aem/: the per-response advantage scale
    "aem_alpha_mean": "aem/alpha_mean", "aem_alpha_min": "aem/alpha_min", "aem_alpha_max": "aem/alpha_max",
    # actfocus/: token weights and the reference-energy diagnostic
    "actfocus_weight_action": "actfocus/weight_action",
    "actfocus_weight_reasoning": "actfocus/weight_reasoning", "actfocus_weight_min": "actfocus/weight_min",
    "actfocus_weight_max": "actfocus/weight_max", "action_token_share": "actfocus/action_token_share",
    "energy_action": "actfocus/energy_action", "energy_reasoning": "actfocus/energy_reasoning",
    "energy_reward_corr_pearson": "actfocus/energy_reward_corr_pearson",
    "energy_reward_corr_spearman": "actfocus/energy_reward_corr_spearman",
    "energy_reward_corr_groups": "actfocus/energy_reward_corr_groups",
    "energy_reward_corr_reasoning_pearson": "actfocus/energy_reward_corr_reasoning_pearson",
    "energy_reward_corr_reasoning_spearman": "actfocus/energy_reward_corr_reasoning_spearman",
    "group_energy_action": "actfocus/group_energy_action",
    "group_energy_reasoning": "actfocus/group_energy_reasoning",
    "group_reward_var": "actfocus/group_reward_var",
    # actor/: the engine/learner mismatch and its importance-sampling correction
    "is_ratio_mean": "actor/is_ratio_mean", "is_ratio_max": "actor/is_ratio_max",
    "is_capped_fraction": "actor/is_capped_fraction", "mismatch_kl_k1": "actor/mismatch_kl_k1",
    "mismatch_kl_k3": "actor/mismatch_kl_k3",
    # timing_s/
    "update_s": "timing_s/update",
}
"""`UpdateMetrics` field → its name in metrics.jsonl, TensorBoard and W&B (docs/metrics.md says what each
means). The loop adds `rollout/`, `reward/` (success), `timing_s/` and `val/` names of its own."""


def grouped_update_metrics(update: Mapping[str, Any]) -> dict[str, Any]:
    """A learner update's metrics (`dataclasses.asdict(UpdateMetrics)`) under their grouped names."""
    unknown = set(update) - set(UPDATE_METRICS)
    if unknown:  # a new UpdateMetrics field must get a name here, or it would vanish from the dashboards
        raise KeyError(f"no metric name for UpdateMetrics field(s) {sorted(unknown)}: add them to "
                       "UPDATE_METRICS")
    return {UPDATE_METRICS[k]: v for k, v in update.items()}


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric fields of a metrics row (flags, strings, NaN and the step left out), under
    their grouped names (`actor/entropy`, `val/success_rate`, ...) as the dashboards show them."""
    return {k: float(v) for k, v in row.items()
            if k != "train_step" and not isinstance(v, bool) and isinstance(v, int | float)
            and math.isfinite(v)}


class TensorBoardWriter:
    """Numeric fields of a metrics row → TensorBoard scalars (grouped names), at the row's train_step."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, row: Mapping[str, Any]) -> None:
        step = int(row["train_step"])
        for key, value in scalars(row).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbWriter:
    """Numeric fields of a metrics row → a W&B run (resumed under the same id when the training run is)."""

    def __init__(self, run_dir: str | Path, cfg: MetricsConfig, config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError("metrics.wandb is on but wandb is not installed: pip install 'swerl[wandb]' "
                               "(or set metrics.wandb=false)") from e
        run_dir = Path(run_dir)
        id_file = run_dir / "wandb_run_id"
        if id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(4)  # W&B ids are [a-z0-9]; kept so a resumed run logs to the same one
            id_file.write_text(run_id)
        self._run = wandb.init(project=cfg.wandb_project, name=run_dir.name, id=run_id, resume="allow",
                               dir=str(run_dir), mode=cfg.wandb_mode, config=dict(config))

    def write(self, row: Mapping[str, Any]) -> None:
        self._run.log(scalars(row), step=int(row["train_step"]))

    def close(self) -> None:
        import wandb

        self._run.finish()
        # W&B's service process writes the run's files; wait for it to flush and exit here, since a
        # distributed run leaves without interpreter teardown (and W&B's own exit hook)
        wandb.teardown()


# ---- the live progress line of `swerl train` --------------------------------------------------------


class TrainDisplay:
    """What the user of `swerl train` sees: one live line per run with the step, the phase, episodes done
    and in flight, the last step's headline numbers and the ETA (rich). Off when the output is not a
    terminal or `metrics.progress` is false; the log lines still go out either way.

        with TrainDisplay(total_steps, start_step) as ui:
            ui.phase("rollout"); ui.episodes(summary); ui.step_done(row)
    """

    def __init__(self, total_steps: int, start_step: int = 0, *, enabled: bool = True,
                 log: Callable[[str], None] | None = print, console: Console | None = None) -> None:
        from rich.console import Console

        self.total, self.start = total_steps, start_step
        self.log = log
        self.console = console or Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._fields = {"phase": "starting", "episodes": "", "last": ""}

    def __enter__(self) -> TrainDisplay:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(bar_width=20), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("[bold]{task.fields[phase]}"),
                TextColumn("{task.fields[episodes]}"), TextColumn("{task.fields[last]}"),
                console=self.console, transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self.start,
                                                 **self._fields)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def _update(self, **kw: Any) -> None:
        self._fields.update(kw)
        if self._progress is not None:
            self._progress.update(self._task, **kw)

    def phase(self, name: str) -> None:
        """rollout | learn | sync | checkpoint | export."""
        self._update(phase=name, episodes="" if name != "rollout" else self._fields["episodes"])

    def episodes(self, summary: Any) -> None:
        """A runner's counts (done / total, in flight, failed)."""
        failed = f", failed {summary.failed}" if summary.failed else ""
        self._update(episodes=f"episodes {summary.done}/{summary.total} ({summary.running} in "
                              f"flight{failed})")

    def step_done(self, step: int, line: str, short: str) -> None:
        """After a step: advance the bar, show `short`, log `line`."""
        if self._progress is not None:
            self._progress.update(self._task, completed=step, last=short, episodes="")
            self._progress.console.print(line, highlight=False)
        elif self.log:
            self.log(line)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)
        elif self.log:
            self.log(text)
