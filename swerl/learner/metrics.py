"""Metrics of a training run: the ActFocus diagnostic, the metrics config, TensorBoard and plots.

* `energy_reward_correlation`: THE ActFocus diagnostic (arXiv 2605.14558), a pure function: the
  correlation across rollout groups between a group's mean action-token energy (under the frozen
  reference) and the variance of its rewards. A positive value says the groups whose actions the
  reference is unsure about are the groups where the outcome is undecided, i.e. where the learning
  signal is.
* `group_energy_reward_stats`: the per-group inputs of that correlation, from the learner's tensors.
* `MetricsConfig` / `TensorBoardWriter`: metrics.jsonl is always written; TensorBoard when enabled.
* `plot_metrics`: PNG curves from <run_dir>/metrics.jsonl (`swerl plot`).

torch is the only heavy import at module level; tensorboard and matplotlib are imported lazily.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

_NAN = float("nan")


# ---- the ActFocus diagnostic -----------------------------------------------------------------------


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 0 or syy <= 0:
        return _NAN
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def rank(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values get the mean of the ranks they span (as Spearman's rho needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def energy_reward_correlation(energy: Sequence[float], reward_var: Sequence[float],
                              min_groups: int = 3) -> tuple[float, float]:
    """(Pearson, Spearman) correlation across groups of `energy[g]` (group g's mean action-token energy)
    and `reward_var[g]` (the variance of group g's rewards).

    Groups with a non-finite value (e.g. no action tokens) are dropped first. Both are NaN when fewer
    than `min_groups` groups remain or either side has zero variance (a correlation is undefined).
    Spearman is Pearson on the ranks (ties get mean ranks).
    """
    if len(energy) != len(reward_var):
        raise ValueError(f"energy has {len(energy)} groups but reward_var has {len(reward_var)}")
    pairs = [(float(e), float(v)) for e, v in zip(energy, reward_var, strict=True)
             if math.isfinite(e) and math.isfinite(v)]
    if len(pairs) < max(min_groups, 2):
        return _NAN, _NAN
    x = [p[0] for p in pairs]
    y = [p[1] for p in pairs]
    pearson = _pearson(x, y)
    if math.isnan(pearson):
        return _NAN, _NAN
    return pearson, _pearson(rank(x), rank(y))


def group_energy_reward_stats(energy: Tensor, action: Tensor, rewards: Tensor,
                              group: Tensor) -> tuple[list[float], list[float]]:
    """Per rollout group (in order of first appearance): the mean energy over all the group's action
    tokens (NaN when it has none) and the population variance of its episode rewards.

    energy, action: (K, T) per-token energy and action-token mask; rewards, group: (K,).
    """
    action = action.bool()
    tok_energy = torch.where(action, energy.float(), 0).sum(1)  # (K,)
    tok_count = action.sum(1)
    energies, variances = [], []
    for g in dict.fromkeys(group.tolist()):
        rows = group == g
        n = int(tok_count[rows].sum())
        energies.append(float(tok_energy[rows].sum()) / n if n else _NAN)
        r = rewards[rows].double()
        variances.append(float(((r - r.mean()) ** 2).mean()))
    return energies, variances


# ---- config and TensorBoard ------------------------------------------------------------------------


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
            raise ValueError(f"metrics.wandb_mode must be online, offline or disabled, got {self.wandb_mode!r}")


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric fields of a metrics row (flags, strings, NaN and the step left out), named
    `train/<field>` as the dashboards show them."""
    return {f"train/{k}": float(v) for k, v in row.items()
            if k != "train_step" and not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)}


class TensorBoardWriter:
    """Numeric fields of a metrics row → TensorBoard scalars under `train/`, at the row's train_step."""

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


# ---- plots -----------------------------------------------------------------------------------------

PLOTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("reward", ("reward_mean", "reward_shaped_mean")),
    "success": ("success / resolve rate", ("success_rate",)),
    "time": ("seconds per step", ("rollout_s", "update_s", "sync_s")),
    "loss": ("loss", ("loss", "pg_loss")),
    "entropy": ("entropy (nats/token)", ("entropy",)),
    "kl": ("KL", ("kl", "approx_kl")),
    "grad_norm": ("grad norm", ("grad_norm",)),
    "action_share": ("action tokens / generated tokens", ("action_token_share",)),
    "energy": ("reference energy", ("energy_action", "energy_reasoning")),
    "energy_reward_corr": ("corr(group action energy, group reward variance)",
                           ("energy_reward_corr_pearson", "energy_reward_corr_spearman")),
}
"""file stem → (y label, metrics.jsonl keys drawn as curves)."""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (a torn last line is skipped); FileNotFoundError / ValueError when the
    file is missing or has no rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path} (a training run writes <run_dir>/metrics.jsonl)")
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "train_step" in row:
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no metrics rows")
    return rows


def plot_metrics(run_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """One PNG per entry of `PLOTS` from <run_dir>/metrics.jsonl, written to `out` (default
    <run_dir>/plots); returns the files written. Missing / null values are left as gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    out_dir = Path(out) if out is not None else Path(run_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [r["train_step"] for r in rows]
    written = []
    for stem, (ylabel, keys) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = 0
        for key in keys:
            ys = [r.get(key) for r in rows]
            ys = [float(y) if isinstance(y, int | float) and not isinstance(y, bool) else _NAN for y in ys]
            if all(math.isnan(y) for y in ys):
                continue
            ax.plot(steps, ys, marker="." if len(steps) < 50 else None, label=key)
            drawn += 1
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("train step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
