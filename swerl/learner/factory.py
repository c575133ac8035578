"""`make_learner`: the learner a LearnerConfig asks for: one `Learner` over the backend it names (plain
torch or DeepSpeed), its policy wrapped with LoRA or not.

DeepSpeed and peft are imported only when the config needs them.
"""

from __future__ import annotations

from typing import Any

import torch

from swerl.learner.backend import LearnerBackend, ModelFactory
from swerl.learner.config import AlgoConfig, LearnerConfig, OptimConfig
from swerl.learner.dist import Storage
from swerl.learner.learner import Learner
from swerl.learner.torch_backend import TorchBackend


def make_learner(model: torch.nn.Module | ModelFactory, algo_cfg: AlgoConfig, optim_cfg: OptimConfig,
                 learner_cfg: LearnerConfig, *, device: str = "cpu", total_steps: int | None = None,
                 ds_overrides: dict[str, Any] | None = None, storage: Storage | None = None) -> Learner:
    """The learner for `learner_cfg`, training `model`: a transformers causal LM (the same on every
    rank), or a `ModelFactory` that builds it.

    backend torch: a `Learner` over `TorchBackend` on `device`; a factory is called once.
    backend deepspeed: a `Learner` over `DeepSpeedBackend` on the live process group (create it inside
    `dist.init_distributed(learner_cfg.dist_backend, required=True)`); `device` cpu or cuda (each rank
    takes its `cuda:<local_rank>`). With zero_stage 3 pass a factory: the policy and the frozen
    reference are then built partitioned over the ranks (a built model is a full copy on every rank
    before DeepSpeed partitions it); with stages 0–2 it is called once. A factory's model should be in
    the training dtype (bf16 with learner.bf16; DeepSpeed keeps fp32 master weights in its optimizer).
    With lora.enabled the model is wrapped with peft adapters (deterministic initialisation, the same
    on every rank) whatever the backend: a built model here, a factory's once it is built (under
    ZeRO-3 by the backend, after the partitioned construction). `total_steps`: optimizer steps of the
    whole run (updates × ppo_epochs × mini_batches), the horizon of a decaying LR schedule.
    `ds_overrides`: merged into the DeepSpeed config (tuning knobs; deepspeed only). `storage`: which
    ranks share the run directory (`dist.probe_storage`; deepspeed only, None: all of them).
    """
    built = isinstance(model, torch.nn.Module)
    if not built and not callable(model):
        raise TypeError("model must be a causal LM (a torch module) or a zero-argument callable that builds "
                        f"one, got {type(model).__name__}")
    if learner_cfg.backend != "deepspeed":
        if ds_overrides:
            raise ValueError("ds_overrides is for learner.backend: deepspeed")
        if not built:
            model = model()  # type: ignore[operator]
            built = True
    if built and learner_cfg.lora.enabled:
        from swerl.learner.lora import apply_lora

        model = apply_lora(model, learner_cfg.lora)
    backend: LearnerBackend
    if learner_cfg.backend == "deepspeed":
        from swerl.learner.ds_learner import DeepSpeedBackend

        backend = DeepSpeedBackend(model, algo_cfg, optim_cfg, learner_cfg, device=device,
                                   total_steps=total_steps, ds_overrides=ds_overrides, storage=storage)
    else:
        backend = TorchBackend(model, algo_cfg, optim_cfg, device=device, total_steps=total_steps)
    return Learner(backend, algo_cfg, optim_cfg)
