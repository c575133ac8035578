"""`make_learner`: the learner a LearnerConfig asks for (plain torch or DeepSpeed, with or without LoRA).

DeepSpeed and peft are imported only when the config needs them.
"""

from __future__ import annotations

from typing import Any

from swerl.learner.config import AlgoConfig, LearnerConfig, OptimConfig
from swerl.learner.learner import Learner


def make_learner(model: Any, algo_cfg: AlgoConfig, optim_cfg: OptimConfig, learner_cfg: LearnerConfig, *,
                 device: str = "cpu", total_steps: int | None = None,
                 ds_overrides: dict[str, Any] | None = None) -> Learner:
    """The learner for `learner_cfg`, training `model` (a transformers causal LM, the same on every rank).

    backend torch: `Learner` (or `LoRALearner` with lora.enabled) on `device`. backend deepspeed:
    `DeepSpeedLearner` over the live process group (create it inside
    `dist.init_distributed(learner_cfg.dist_backend, required=True)`); `device` cpu or cuda (each rank
    takes its `cuda:<local_rank>`). With lora.enabled the model is wrapped with peft adapters first
    (deterministic initialisation, the same on every rank). `total_steps`: optimizer steps of the
    whole run (updates × ppo_epochs × mini_batches), the horizon of a decaying LR schedule.
    `ds_overrides`: merged into the DeepSpeed config (tuning knobs; deepspeed only).
    """
    if learner_cfg.lora.enabled:
        from swerl.learner.lora import apply_lora

        model = apply_lora(model, learner_cfg.lora)
    if learner_cfg.backend == "deepspeed":
        from swerl.learner.ds_learner import DeepSpeedLearner

        return DeepSpeedLearner(model, algo_cfg, optim_cfg, learner_cfg, device=device, total_steps=total_steps,
                                ds_overrides=ds_overrides)
    if ds_overrides:
        raise ValueError("ds_overrides is for learner.backend: deepspeed")
    if learner_cfg.lora.enabled:
        from swerl.learner.lora import LoRALearner

        return LoRALearner(model, algo_cfg, optim_cfg, device=device, total_steps=total_steps)
    return Learner(model, algo_cfg, optim_cfg, device=device, total_steps=total_steps)
