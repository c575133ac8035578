"""Writing a run's metrics: the `metrics:` config section (`MetricsConfig`), a learner update's fields
under their grouped names (`UPDATE_METRICS` / `grouped_update_metrics`; docs/metrics.md), the numeric
part of a row (`scalars`), and the optional sinks of each metrics.jsonl row: TensorBoard
(`TensorBoardWriter`) and W&B (`WandbWriter`), imported when used."""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

