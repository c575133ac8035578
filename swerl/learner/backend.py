"""The learner's backend strategy: where the policy's tensors live, how a loss becomes a step, and how
weights and checkpoints leave the process.

`swerl.learner.learner.Learner` owns the algorithm (advantages, filtering, micro-batching, losses,
metrics) and talks to a `LearnerBackend`, of which there are two, sharing no code by inheritance:
  * `swerl.learner.torch_backend.TorchBackend`: one process, plain torch autograd and AdamW;
  * `swerl.learner.ds_learner.DeepSpeedBackend`: DeepSpeed ZeRO 0–3 over the live process group.
LoRA is not a backend: it is the policy wrapped by peft (`swerl.learner.lora.apply_lora`), which
either backend trains (only the adapters require grad) with the base model, adapters off, as its
frozen reference. The helpers below are what both backends do alike when they take their models.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from swerl import algo
from swerl.learner.batch import Batch
from swerl.learner.config import AlgoConfig, OptimConfig, lr_factor
from swerl.learner.lora import AdapterDisabledReference, is_peft
from swerl.learner.weights import WeightBucket, WeightMeta

ModelFactory = Callable[[], Any]
"""A zero-argument callable that builds the initial policy (a transformers causal LM), the same weights
on every call and every rank: e.g. `lambda: AutoModelForCausalLM.from_pretrained(path, dtype=...)`, or a
seeded random init. The DeepSpeed learner calls it under ZeRO-3's partitioned construction (see
`swerl.learner.ds_learner.zero3_construction`), so no rank ever holds the whole model."""


def sequence_stats(model: Any, batch: Any, *, chunk_size: int, temperature: float = 1.0,
                   compute_entropy: bool = True, where: Tensor | None = None,
                   prefix: int = 0) -> algo.TokenStats:
    """Per-token log-prob, entropy and energy of `batch` (its `input_ids`, `attention_mask`) under a
    causal LM (Qwen2-style: `model.model` gives the final hidden states, `model.lm_head.weight` the
    output embedding).

    Returns TokenStats of shape (B, T − 1): entry t is about token t + 1 (predicted from position t).
    `where`: (B, T − 1) bool, the entries wanted; the LM head then runs on those tokens only and the
    other entries are 0. The learner reads stats at generated tokens alone, and in an agent's
    trajectory most tokens are prompt, tool output or padding: the head (V × H, the largest matmul
    per token with a large vocabulary) is skipped on all of them, in forward and in backward.
    `prefix`: the first `prefix` tokens are the same in every row and no entry wanted is about them
    (`shared_prefix`): they are fed once, for one row, and every row attends to that row's keys and
    values; their entries are 0. Rollout groups share their prompt, a run its system prompt.
    """
    ids = batch.input_ids
    targets = ids[:, 1:]  # (B, T − 1)
    if where is not None and (where.shape != targets.shape or where.dtype != torch.bool
                              or where.device != ids.device):
        raise ValueError(f"where must be a bool tensor of shape {tuple(targets.shape)} on {ids.device}, got "
                         f"{where.dtype} {tuple(where.shape)} on {where.device}")
    if prefix and (where is None or not 0 < prefix < ids.shape[1] or bool(where[:, :prefix].any())):
        raise ValueError(f"sequence_stats: prefix {prefix} is not a shared prefix of this batch (see "
                         "shared_prefix); it needs `where`, with no entry wanted before it")
    hidden = _final_hidden(model, ids, batch.attention_mask, prefix)  # (B, T − 1 − prefix, H)
    if prefix:  # the entries before `prefix` are 0: computed on the rest, then shifted back
        targets, where = targets[:, prefix:], where[:, prefix:]
    weight = model.lm_head.weight
    if where is None:
        return algo.token_statistics(hidden, weight, targets, chunk_size=chunk_size, temperature=temperature,
                                     compute_entropy=compute_entropy)
    idx = where.flatten().nonzero().squeeze(1)  # (N,) flat positions wanted
    s = algo.token_statistics(hidden.flatten(0, 1).index_select(0, idx), weight,  # (N, H) → (N,)
                              targets.flatten().index_select(0, idx), chunk_size=chunk_size,
                              temperature=temperature, compute_entropy=compute_entropy)

    def spread(x: Tensor) -> Tensor:  # (N,) → (B, T − 1), 0 off `where`; differentiable in x
        x = x.new_zeros(where.numel()).index_copy(0, idx, x).view(where.shape)
        return torch.cat([x.new_zeros(len(x), prefix), x], dim=1) if prefix else x

    return algo.TokenStats(spread(s.logp), None if s.entropy is None else spread(s.entropy), spread(s.energy))


def _final_hidden(model: Any, ids: Tensor, attention_mask: Tensor, prefix: int) -> Tensor:
    """The final hidden states at positions `prefix` … T − 2 of `ids` (B, T): (B, T − 1 − prefix, H); the
    first `prefix` tokens (the same in every row) are fed for one row only, whose keys and values every
    row then attends to."""
    if not prefix:
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return model.model(input_ids=ids, attention_mask=attention_mask, position_ids=pos,
                           use_cache=False).last_hidden_state[:, :-1]
    from transformers import DynamicCache

    b, width = ids.shape
    head = torch.arange(prefix, device=ids.device)[None]
    one = model.model(input_ids=ids[:1, :prefix], position_ids=head, use_cache=True).cache
    # expanded, not copied: the cache's first update concatenates the rows' own keys and values to it
    past = DynamicCache([(layer.keys.expand(b, -1, -1, -1), layer.values.expand(b, -1, -1, -1))
                         for layer in one.layers], config=model.config)
    pos = torch.arange(prefix, width, device=ids.device).expand(b, -1)
    return model.model(input_ids=ids[:, prefix:], attention_mask=attention_mask, position_ids=pos, cache=past,
                       use_cache=True).last_hidden_state[:, :-1]


def shared_prefix(batch: Any, where: Tensor) -> int:
    """The `prefix` of `sequence_stats` for `batch` and `where` (B, T − 1): the tokens every row starts
    with, up to the first entry wanted (its hidden state must be computed) and short of the shortest row.
    0 for a single row (nothing to share)."""
    ids = batch.input_ids
    if len(ids) < 2:
        return 0
    common = int((ids == ids[:1]).all(0).int().cumprod(0).sum())  # padding can match: capped below
    wanted = where.any(0).nonzero()
    first = int(wanted[0]) if len(wanted) else ids.shape[1] - 1
    shortest = int(batch.attention_mask.sum(1).min())
    return max(0, min(common, first, shortest - 1))


def loss_positions(batch: Batch) -> Tensor:
    """(B, T − 1) bool: the entries of `sequence_stats` the learner reads (about tokens in the loss)."""
    return batch.loss_mask[:, 1:].bool()


@dataclass(frozen=True)
class World:
    """This process's place among the learner's data-parallel ranks."""

    rank: int
    size: int
    """Ranks whose gradients are averaged."""
    collective: bool
    """Every call is collective and `update` gets this rank's share of the batch: its metrics are
    combined over the ranks (true for DeepSpeed even on one rank, false for plain torch)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE_PROCESS = World(rank=0, size=1, collective=False)


@runtime_checkable
class LearnerBackend(Protocol):
    """What the learner needs of a backend. `policy` and `reference` are the models the learner
    names when it asks for a forward; `optimizer` is read for its learning rate."""

    @property
    def device(self) -> torch.device: ...

    @property
    def world(self) -> World: ...

    @property
    def policy(self) -> Any:
        """The trained causal LM (peft-wrapped with LoRA)."""

    @property
    def reference(self) -> Any:
        """The frozen reference (KL / ActFocus), or None when the algorithm needs none."""

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    def forward(self, model: Any, batch: Batch, *, compute_entropy: bool) -> algo.TokenStats:
        """`sequence_stats` of `batch` under `model` (this backend's `policy` or `reference`) at the
        batch's `loss_positions`, 0 elsewhere."""

    def begin_accumulation(self, backward_passes: int) -> None:
        """The number of `backward` calls before the next `step` (a distributed backend reduces
        gradients over ranks at the last one)."""

    def backward(self, loss: Tensor) -> None: ...

    def step(self) -> float:
        """Clip, step optimizer and LR schedule, zero grads; the gradient norm before clipping."""

    def sum_over_ranks(self, value: float) -> float: ...

    def max_over_ranks(self, value: int) -> int: ...

    def all_gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank, in rank order."""

    def settle(self) -> None:
        """Finish communication left in flight by an update (before weights are read)."""

    def policy_state_dict(self, *, rank0_only: bool = False) -> dict[str, Tensor]:
        """Full policy weights on CPU under plain transformers names (LoRA merged in)."""

    def iter_weight_buckets(self, bucket_bytes: int, *,
                            device: torch.device | str = "cpu") -> Iterator[WeightBucket]:
        """The policy's weights (plain transformers names, LoRA merged, a tied weight once) in buckets
        of at most `bucket_bytes` (a larger weight alone), copied to `device` one module at a time:
        never the whole model at once. Collective under ZeRO-3: every rank drains it."""

    def weight_meta(self) -> list[WeightMeta]:
        """Name, dtype and full shape of each weight `iter_weight_buckets` yields, in its order,
        without copying or gathering."""

    def export_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path: ...

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and LR schedule in one process's memory (plain torch only)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save_checkpoint(self, run_dir: str | os.PathLike[str], step: int, rank_state: dict[str, Any],
                        extra: dict[str, Any], *, keep_last: int) -> Path:
        """Write checkpoint `step` atomically: the backend's state, this rank's `rank_state` (the
        learner's step and RNGs) and `extra` (the loop's)."""

    def load_checkpoint(self, path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore the backend's state from `path`; (this rank's `rank_state`, `extra`)."""


def place_models(model: Any, algo_cfg: AlgoConfig, optim: OptimConfig, device: torch.device, *,
                 reference: Any = None) -> tuple[Any, Any]:
    """(policy, frozen reference or None) on `device`. The reference is `reference` when given, else,
    when the algorithm needs one, the base of a LoRA policy (adapters off: no copy) or a copy of
    `model` taken now."""
    if optim.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    policy = model.to(device)
    if not algo_cfg.needs_reference:
        return policy, None
    if reference is None:
        reference = AdapterDisabledReference(model) if is_peft(model) else copy.deepcopy(model)
    return policy, reference.to(device).eval().requires_grad_(False)


def trainable(policy: Any) -> list[torch.nn.Parameter]:
    """The parameters the optimizer holds (a LoRA policy's adapters only)."""
    return [p for p in policy.parameters() if p.requires_grad]


def lr_schedule(optimizer: torch.optim.Optimizer, optim: OptimConfig,
                total_steps: int | None) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of `optim` over `total_steps` optimizer steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_factor(i, optim, total_steps))


def adamw(policy: Any, optim: OptimConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(trainable(policy), lr=optim.lr, betas=optim.betas, eps=optim.eps,
                             weight_decay=optim.weight_decay)
