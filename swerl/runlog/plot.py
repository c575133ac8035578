"""The dashboard of `swerl plot`: its panels (`PANELS`), every run overlaid on every panel, the raw curve
faint under an exponentially smoothed one (`ema`), drawn as one figure (`build_figure`) and written to a
.png / .svg file (`plot_runs`). matplotlib is imported when a figure is drawn, never at import; the figure
is drawn on an Agg canvas of its own, never through pyplot."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

from swerl.runlog.runs import _NAN, BAND_MAX, BAND_MIN, PathLike, Run, _number, merge_seeds, read_runs

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

