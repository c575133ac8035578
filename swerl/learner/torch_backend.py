"""The plain torch backend: one process, the policy and its frozen reference on one device, AdamW.

With a LoRA policy (`swerl.learner.lora.apply_lora`) the optimizer holds only the adapters, the
reference is the base model with adapters disabled, and weight syncs / exports are merged plain-HF
weights.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from swerl import algo
from swerl.learner.backend import (
    SINGLE_PROCESS,
    World,
    adamw,
    loss_positions,
    lr_schedule,
    place_models,
    sequence_stats,
    trainable,
)
from swerl.learner.batch import Batch
from swerl.learner.checkpoint import atomic_dir, load_checkpoint, save_checkpoint
from swerl.learner.config import AlgoConfig, OptimConfig
from swerl.learner.lora import (
    AdapterDisabledReference,
    causal_lm,
    is_peft,
    iter_merged_weights,
    merged_state_dict,
    merged_weight_meta,
    save_plain_hf,
)
from swerl.learner.weights import WeightBucket, WeightMeta, bucketed


class TorchBackend:
    """`LearnerBackend` on plain single-process torch."""

    def __init__(self, model: Any, algo_cfg: AlgoConfig, optim: OptimConfig, *, device: str = "cpu",
                 total_steps: int | None = None, reference: Any = None) -> None:
        """`model`: a transformers causal LM, or a peft one to train only its adapters (the policy,
        trained in place). The frozen reference is `reference` when given, else taken from `model`
        now, and kept only when KL or ActFocus needs it. `total_steps`: optimizer steps of the whole
        run, the horizon of a decaying LR schedule."""
        self._device = torch.device(device)
        self._optim = optim
        self._chunk_size = optim.chunk_size
        self._temperature = algo_cfg.temperature
        self._policy, self._reference = place_models(model, algo_cfg, optim, self._device,
                                                     reference=reference)
        self._optimizer = adamw(self._policy, optim)
        self.scheduler = lr_schedule(self._optimizer, optim, total_steps)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def world(self) -> World:
        return SINGLE_PROCESS

    @property
    def policy(self) -> Any:
        return self._policy

    @property
    def reference(self) -> Any:
        return self._reference

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def lora(self) -> bool:
        return is_peft(self._policy)

    # ---- compute ------------------------------------------------------------------------------------

    def forward(self, model: Any, batch: Batch, *, compute_entropy: bool) -> algo.TokenStats:
        if isinstance(model, AdapterDisabledReference):
            with model.adapters_off():
                return self._stats(causal_lm(model.policy), batch, compute_entropy)
        return self._stats(causal_lm(model), batch, compute_entropy)

    def _stats(self, lm: Any, batch: Batch, compute_entropy: bool) -> algo.TokenStats:
        return sequence_stats(lm, batch, chunk_size=self._chunk_size, temperature=self._temperature,
                              compute_entropy=compute_entropy, where=loss_positions(batch))

    def begin_accumulation(self, backward_passes: int) -> None:
        """Gradients accumulate in `.grad` however many passes come."""

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        max_norm = self._optim.grad_clip if self._optim.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(trainable(self._policy), max_norm)
        self._optimizer.step()
        self.scheduler.step()
        self._optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # one process: the collectives are the identity
    def sum_over_ranks(self, value: float) -> float:
        return value

    def max_over_ranks(self, value: int) -> int:
        return value

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def settle(self) -> None:
        """Nothing is ever in flight."""

    # ---- weights, checkpoints, export ---------------------------------------------------------------

    def policy_state_dict(self, *, rank0_only: bool = False) -> dict[str, Tensor]:
        """The policy's weights, detached on CPU (LoRA: merged into plain HF names, what a rollout
        engine of the base model loads). `rank0_only` changes nothing on one process."""
        if self.lora:
            return merged_state_dict(self._policy)
        return {k: v.detach().to("cpu", copy=True) for k, v in self._policy.state_dict().items()}

    def iter_weight_buckets(self, bucket_bytes: int, *,
                            device: torch.device | str = "cpu") -> Iterator[WeightBucket]:
        """The policy's weights (as `policy_state_dict` names them, a tied weight once) in buckets of
        at most `bucket_bytes`, copied to `device` one module at a time."""
        return bucketed(iter_merged_weights(self._policy, device=device), bucket_bytes)

    def weight_meta(self) -> list[WeightMeta]:
        """What `iter_weight_buckets` yields, name by name, without copying anything."""
        return merged_weight_meta(self._policy)

    def export_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
        """The policy in HF format (+ the tokenizer when given), atomically; LoRA merged, no adapters."""
        state = merged_state_dict(self._policy) if self.lora else None
        with atomic_dir(directory) as tmp:
            if state is not None:
                save_plain_hf(causal_lm(self._policy).config, state, tmp, tokenizer)
            else:
                self._policy.save_pretrained(tmp)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        return Path(directory)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self._policy.state_dict(), "optimizer": self._optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._policy.load_state_dict(state["model"])
        self._optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:  # checkpoints from before the LR schedule have none
            self.scheduler.load_state_dict(state["scheduler"])

    def save_checkpoint(self, run_dir: str | os.PathLike[str], step: int, rank_state: dict[str, Any],
                        extra: dict[str, Any], *, keep_last: int) -> Path:
        """One state.pt: {"learner": model, optimizer, scheduler + rank_state, **extra}."""
        state = {"learner": {**self.state_dict(), **rank_state}, **extra}
        return save_checkpoint(run_dir, step, state, keep_last=keep_last)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        state = load_checkpoint(path)
        learner = state.pop("learner")
        self.load_state_dict(learner)
        return learner, state
