"""Training runs as a user looks at them: one dashboard figure (`swerl plot`) and a table of headline
numbers (`swerl compare`) from each run's <run_dir>/metrics.jsonl.

* `read_run` / `read_runs`: a run directory → a `Run` (its name and its metrics rows, by train step).
* `PANELS`: the dashboard's panels (title, metrics drawn, why a panel can be empty), in one table.
* `build_figure` / `plot_runs`: every run overlaid on every panel, one colour per run, the raw curve
  faint under an exponentially smoothed one (`ema`).
* `compare_runs` / `print_compare`: final and best value of each headline metric, per run.

Only the standard library at import time: matplotlib (and rich, for the table) are imported when used,
so `swerl --help` and the training loop never pay for them. The figure is drawn on an Agg canvas of its
own, never through pyplot, so a caller's pyplot backend and state are left alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
        names = ["/".join(p.parts[-d:]) if d < len(p.parts) else str(p) for p, d in zip(paths, depth, strict=True)]
        clash = [i for i, n in enumerate(names) if names.count(n) > 1 and depth[i] < len(paths[i].parts)]
        if not clash:
            return names
        for i in clash:
            depth[i] += 1


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


def _draw_band(ax: Axes, run: Run, band: tuple[str, str], colour: str) -> bool:
    lo_key, hi_key = band
    lo = dict(zip(*run.series(lo_key), strict=True))
    hi = dict(zip(*run.series(hi_key), strict=True))
    steps = sorted(s for s in lo.keys() & hi.keys() if math.isfinite(lo[s]) and math.isfinite(hi[s]))
    if not steps:
        return False
    # a missing step splits the band rather than bridging it
    full = list(range(steps[0], steps[-1] + 1))
    ax.fill_between(full, [lo.get(s, _NAN) for s in full], [hi.get(s, _NAN) for s in full], color=colour,
                    alpha=0.15, lw=0)
    return True


def plot_runs(run_dirs: Sequence[PathLike], out: PathLike, fmt: Literal["png", "svg"] = "png",
              smooth: float = 0.6) -> Path:
    """Write the dashboard of the runs in `run_dirs` to `out` (a .png or .svg file; `.<fmt>` is added
    when `out` has no suffix) and return the path written."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"format must be png or svg, got {fmt!r}")
    out = Path(out)
    if not out.suffix:
        out = out.with_name(f"{out.name}.{fmt}")
    elif out.suffix.lower() != f".{fmt}":
        raise ValueError(f"{out} does not end in .{fmt} (give --format {out.suffix.lstrip('.').lower()} "
                         f"for that file, or name a .{fmt} file)")
    import matplotlib

    fig = build_figure(read_runs(run_dirs), smooth)
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
