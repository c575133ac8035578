"""The learner on DeepSpeed: data-parallel ZeRO 0–3 over the ranks torchrun started (nccl on GPUs,
gloo on CPU), bf16, gradient checkpointing, optimizer / parameter offload, LoRA.

`DeepSpeedLearner` is `Learner.update` unchanged, with the seams overridden:
  * every forward goes through the DeepSpeed engine. The engine wraps `_StatsForward`, a module whose
    forward is `sequence_stats` (final hidden states → chunked log-prob / entropy / energy, never full
    logits); under ZeRO-3 the LM head weight is registered as an external parameter of that module, so
    DeepSpeed gathers it for the statistics and again for their backward.
  * `_backward`: `engine.backward(loss, scale_wrt_gas=False)` (the learner already scales each
    micro-batch's loss so that the sum over micro-batches, averaged over ranks by DeepSpeed, is the
    full-batch loss); the learner announces how many backward passes an optimizer step has
    (`_begin_accumulation`), and the last one is marked as the gradient-accumulation boundary, where
    ZeRO 0/1 all-reduce and ZeRO 2/3 finish their reduce-scatter. DeepSpeed's own accumulation
    counter is set to 1 and overridden by that flag, so one `_optimizer_step` is one real step
    however many micro-batches it had.
  * `_optimizer_step`: `engine.step()` (DeepSpeed clips at `gradient_clipping`, steps the optimizer and
    the learner's LambdaLR, zeroes grads); the reported norm is DeepSpeed's pre-clip global norm. With
    no ZeRO / bf16 wrapper (stage 0, fp32) DeepSpeed clips without keeping the norm, so the learner
    clips itself (gradients are already all-reduced there) and DeepSpeed's clipping is off.
  * `_sum_over_ranks` / `_max_over_ranks` / `world_size`: collectives on the process group.
  * `_mini_batches`: every rank has exactly `mini_batches` mini-batches (empty ones included), so the
    optimizer steps of all ranks line up.

Construction: the learner takes a built model, or a model factory (a zero-argument callable that
builds the causal LM; `swerl.learner.factory.ModelFactory`). Under ZeRO-3 a factory is called inside
`zero3_construction`: transformers' `HfDeepSpeedConfig` is alive (so `from_pretrained` / `from_config`
build under `deepspeed.zero.Init` and copy the checkpoint into the partitions module by module) and
`deepspeed.zero.Init` partitions a directly constructed model (`Qwen2ForCausalLM(config)`) after each
submodule's `__init__`, with transformers' weight init run on each module's gathered parameters by
rank 0. So no rank materialises more than one module's parameters at a time, in the engine's dtype
(bf16 with learner.bf16); the frozen reference is a second call of the factory under the same
context. With stages 0–2 (and a built model) every rank holds the full model anyway: the factory is
called once, as a plain call.

Reference model (KL / ActFocus): with LoRA, the policy engine with adapters disabled (no copy). Else,
under ZeRO 0–2, a frozen local copy on each rank (bf16 when training in bf16): its forwards need no
communication. Under ZeRO-3, a second engine (`deepspeed.initialize` with stage 3 and no optimizer,
i.e. ZeRO-Inference) holding a partitioned copy (built partitioned from a factory; partitioned by the
engine from a copy of a built model): a full copy per rank is what ZeRO-3 is there to avoid; its
forwards are collective, which the learner's equal forward counts over ranks allow.

Checkpoints: `save_checkpoint(run_dir, step, extra)` writes DeepSpeed's per-rank shards (model and
optimizer partitions, LR schedule) plus each rank's RNG / shuffle state into one temporary directory,
and rank 0 renames it into place after every rank is done (`checkpoint.atomic_dir`), so a checkpoint
is complete or absent. Resume needs the same world size, ZeRO stage and LoRA setting.

Offload needs DeepSpeed's CPUAdam (ZeRO-Offload rejects torch optimizers); its C++ extension compiles
on first use (~90 s), so the CPU tests do not exercise it.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import deepspeed
import torch
from torch import Tensor

from swerl import algo
from swerl.learner import dist
from swerl.learner.batch import Batch
from swerl.learner.checkpoint import STATE_FILE, _fsync_tree, atomic_dir, checkpoint_root, list_checkpoints
from swerl.learner.config import AlgoConfig, LearnerConfig, OptimConfig, lr_factor
from swerl.learner.factory import ModelFactory
from swerl.learner.learner import Learner, sequence_stats
from swerl.learner.lora import (
    AdapterDisabledReference,
    apply_lora,
    causal_lm,
    is_peft,
    merged_state_dict,
    save_plain_hf,
)
from swerl.learner.metrics import energy_reward_correlation, group_energy_reward_stats
from swerl.structs import UpdateMetrics

DS_TAG = "deepspeed"
_NAN = float("nan")


@dataclass(frozen=True)
class _Rows:
    """What `sequence_stats` reads of a Batch."""

    input_ids: Tensor
    attention_mask: Tensor


class _StatsForward(torch.nn.Module):
    """The module DeepSpeed runs: (input_ids, attention_mask) → (logp, entropy | None, energy) of the
    wrapped causal LM (see `sequence_stats`)."""

    def __init__(self, lm: Any, *, chunk_size: int, temperature: float) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.temperature = temperature

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                compute_entropy: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
        s = sequence_stats(causal_lm(self.lm), _Rows(input_ids, attention_mask), chunk_size=self.chunk_size,
                           temperature=self.temperature, compute_entropy=compute_entropy)
        return s.logp, s.entropy, s.energy


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_ds_config(cfg: LearnerConfig, optim: OptimConfig, world_size: int, *, cuda: bool,
                    clip: bool = True, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config of the policy engine. Batch sizes are nominal: the learner drives
    accumulation itself (see the module docstring). `clip`: let DeepSpeed clip at optim.grad_clip."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage >= 1:
        zero.update(contiguous_gradients=True, overlap_comm=cuda, reduce_bucket_size=int(5e8),
                    allgather_bucket_size=int(5e8))
    if cfg.zero_stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(5e7), stage3_param_persistence_threshold=int(1e5),
                    stage3_max_live_parameters=int(1e9), stage3_max_reuse_distance=int(1e9),
                    stage3_gather_16bit_weights_on_model_save=False)
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": optim.grad_clip if clip else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    return _merge(config, overrides or {})


def _reference_config(cfg: LearnerConfig, world_size: int, overrides: dict[str, Any] | None, *,
                      cuda: bool) -> dict[str, Any]:
    """ZeRO-3 inference config of the frozen reference engine (no optimizer)."""
    zero: dict[str, Any] = {"stage": 3, "stage3_param_persistence_threshold": int(1e5),
                            "stage3_prefetch_bucket_size": int(5e7)}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": world_size,
              "zero_optimization": zero, "bf16": {"enabled": cfg.bf16}, "steps_per_print": 2**31 - 1}
    over = {k: v for k, v in (overrides or {}).items() if k in ("zero_optimization",)}
    if "zero_optimization" in over:  # only the partitioning knobs apply to an optimizer-less engine
        over = {"zero_optimization": {k: v for k, v in over["zero_optimization"].items() if k.startswith("stage3_")}}
    return _merge(config, over)


@contextlib.contextmanager
def _gather_one_by_one(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """ZeRO-3 gather of `params` for gloo. DeepSpeed 0.19 gathers several parameters with one async
    all-gather each and waits only for the last, which is safe on one CUDA stream but not on gloo,
    whose collectives may finish out of order: there some gathered weights were unfilled buffers.
    One parameter per gather takes DeepSpeed's synchronous path."""
    with contextlib.ExitStack() as stack:
        for p in params:
            stack.enter_context(deepspeed.zero.GatheredParameters([p], modifier_rank=None))
        yield


def _start_comm(cuda: bool) -> None:
    """DeepSpeed's comm layer over the live torch process group. `deepspeed.initialize` starts it too,
    but `deepspeed.zero.Init` reads the world size from it before that (and would see 1)."""
    if not cuda:
        # DeepSpeed's CPU accelerator builds a shared-memory all-reduce extension when its comm layer
        # starts (a ~90 s C++ compile on first use); only its tensor-parallel inference uses it
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())


@contextlib.contextmanager
def zero3_construction(config: dict[str, Any]) -> Iterator[None]:
    """Inside the block, models are built ZeRO-3 partitioned over the ranks (`config`: a stage-3
    DeepSpeed config; DeepSpeed's comm layer must be up). Every rank enters it and builds the same model.

    * transformers' `HfDeepSpeedConfig` is alive (transformers keeps only a weak reference to it), so
      `from_pretrained` / `from_config` construct under their own `deepspeed.zero.Init` and copy the
      checkpoint into the partitions one module at a time (rank 0 reads the files, memory-mapped);
    * `deepspeed.zero.Init` partitions a directly constructed model (`Qwen2ForCausalLM(config)`) after
      each submodule's `__init__`, creating its tensors in the engine's dtype (bf16 with bf16 on);
    * transformers' `post_init` weight init would then run on the emptied partitions (and fail on an
      embedding's padding row), so while the block is open `PreTrainedModel.init_weights` runs it on
      each module's gathered parameters on rank 0, which broadcasts them (transformers'
      `initialize_weights_zero3`, the same module order and RNG draws as a plain construction: a
      seeded init gives the same weights as outside the block). `from_pretrained` / `from_config`
      switch `init_weights` off while they construct, so they are not affected;
    * the gathers inside the block (that init, and transformers' checkpoint copy) take one parameter
      at a time: DeepSpeed 0.19 gathers several with async all-gathers and waits only for the last,
      which on gloo (collectives finishing out of order) let a late gather overwrite what rank 0 had
      just written (seen: one weight left at its pre-init values, or garbage after a load). The
      parameters keep the `Init` that made them, which is set back to the config's setting on exit
      (with sequential gathers the engine's prefetched parameters were later found marked available
      with empty tensors, on gloo).
    On exit the switches are undone (transformers' ZeRO-3 flag is cleared: later loads are plain)."""
    from transformers import PreTrainedModel
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import initialize_weights_zero3, unset_hf_deepspeed_config

    plain_init = PreTrainedModel.init_weights

    def init_weights(model: Any) -> None:
        if not any(hasattr(p, "ds_id") for p in model.parameters()):
            plain_init(model)
            return
        initialize_weights_zero3(model)
        model.tie_weights(recompute_mapping=False)  # what the plain init_weights does after initialising

    hf_config = HfDeepSpeedConfig(config)
    init = deepspeed.zero.Init(config_dict_or_path=config)
    sequential = init.allgather_sequential
    init.allgather_sequential = True
    PreTrainedModel.init_weights = init_weights  # type: ignore[method-assign]
    try:
        with init:
            yield
    finally:
        PreTrainedModel.init_weights = plain_init  # type: ignore[method-assign]
        init.allgather_sequential = sequential
        unset_hf_deepspeed_config()
        del hf_config


def _build_partitioned(factory: ModelFactory, config: dict[str, Any]) -> Any:
    """`factory()` under `zero3_construction`; checks that it did build a partitioned model."""
    with zero3_construction(config):
        model = factory()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"the model factory returned {type(model).__name__}, not a torch module (a causal LM)")
    whole = [name for name, p in model.named_parameters() if not hasattr(p, "ds_id")]
    if whole:
        raise ValueError(f"the model factory returned a model with parameters that are not ZeRO-3 partitions "
                         f"({', '.join(whole[:3])}{', ...' if len(whole) > 3 else ''}): it must construct the model "
                         "when called (e.g. `lambda: AutoModelForCausalLM.from_pretrained(path)`), not return one "
                         "built before")
    return model


def _check_same_partitions(policy: Any, reference: Any) -> None:
    """The reference (a second factory call) must start as the policy: compare each rank's partitions
    (no gathering) and agree over ranks. A factory with an unseeded random init fails here."""
    pol, ref = dict(policy.named_parameters()), dict(reference.named_parameters())
    same = pol.keys() == ref.keys() and all(torch.equal(p.ds_tensor, ref[k].ds_tensor) for k, p in pol.items())
    if dist.sum_over_ranks(0.0 if same else 1.0) > 0:
        raise ValueError("the model factory built different weights on its second call (the frozen reference "
                         "model): it must build the same model every call (load a checkpoint, or seed a random init)")


class DeepSpeedLearner(Learner):
    """`Learner` on a DeepSpeed engine; one instance per rank, every method called on every rank
    (the forwards, steps, weight gathers and checkpoint writes are collective)."""

    def __init__(self, model: torch.nn.Module | ModelFactory, algo_cfg: AlgoConfig, optim: OptimConfig,
                 learner_cfg: LearnerConfig, *, device: str = "cpu", total_steps: int | None = None,
                 ds_overrides: dict[str, Any] | None = None) -> None:
        """`model`: a transformers causal LM, or a peft model (`swerl.learner.lora.apply_lora`) to train
        only its adapters; identical on every rank. Or a `ModelFactory`: a zero-argument callable that
        builds the causal LM, the same weights on every call and rank (a checkpoint, or a seeded init),
        in the training dtype (bf16 with learner_cfg.bf16; DeepSpeed keeps fp32 master weights). Under
        ZeRO-3 it is called inside `zero3_construction`, for the policy and again for the frozen
        reference, so no rank holds a whole model; else once. Its model gets LoRA adapters here when
        learner_cfg.lora.enabled (after the partitioned construction, as plain small tensors the
        engine then partitions). `device`: cpu, or cuda (this rank's `cuda:<local_rank>`).
        `ds_overrides`: merged into the built DeepSpeed config (tuning knobs).
        Needs a live process group: `with swerl.learner.dist.init_distributed(required=True): ...`."""
        if not torch.distributed.is_initialized():
            raise RuntimeError("DeepSpeedLearner needs a process group: create the learner inside "
                               "`with swerl.learner.dist.init_distributed(cfg.dist_backend, required=True):` "
                               "(under torchrun, or as a single process)")
        if not isinstance(model, torch.nn.Module) and not callable(model):
            raise TypeError(f"model must be a causal LM (a torch module) or a zero-argument callable that builds "
                            f"one, got {type(model).__name__}")
        self.cfg = learner_cfg
        self.dist = dist.info()
        cuda = device.startswith("cuda")
        if cuda and ":" not in device:
            device = f"cuda:{self.dist.local_rank}"
        self._zero3 = learner_cfg.zero_stage == 3
        # stage 0 in fp32 leaves the torch optimizer unwrapped: DeepSpeed would clip without reporting
        self._manual_clip = learner_cfg.zero_stage == 0 and not learner_cfg.bf16
        config = build_ds_config(learner_cfg, optim, self.dist.world_size, cuda=cuda,
                                 clip=not self._manual_clip, overrides=ds_overrides)
        ref_config = _reference_config(learner_cfg, self.dist.world_size, ds_overrides, cuda=cuda)
        _start_comm(cuda)
        ref = None
        if not isinstance(model, torch.nn.Module):
            model, ref = self._build(model, algo_cfg, config, ref_config)
        self.lora = is_peft(model)
        if self.lora and algo_cfg.needs_reference:
            ref = AdapterDisabledReference(model)
        super().__init__(model, algo_cfg, optim, device=device, total_steps=total_steps, reference=ref)
        if learner_cfg.offload_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            self.optimizer = DeepSpeedCPUAdam([p for p in self.policy.parameters() if p.requires_grad], lr=optim.lr,
                                              betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay,
                                              adamw_mode=True)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda i: lr_factor(i, optim, total_steps))
        self._forward = _StatsForward(self.policy, chunk_size=optim.chunk_size, temperature=algo_cfg.temperature)
        self.engine, _, _, _ = deepspeed.initialize(model=self._forward, optimizer=self.optimizer,
                                                    lr_scheduler=self.scheduler, config=config)
        if self._zero3:
            deepspeed.zero.register_external_parameter(self._forward, causal_lm(self.policy).lm_head.weight)
        self._ref_engine: Any = None
        if self.reference is not None and not self.lora:
            if learner_cfg.bf16:
                self.reference.to(torch.bfloat16)
            if self._zero3:
                ref_fwd = _StatsForward(self.reference, chunk_size=optim.chunk_size, temperature=algo_cfg.temperature)
                self._ref_engine, _, _, _ = deepspeed.initialize(model=ref_fwd, config=ref_config)
                deepspeed.zero.register_external_parameter(ref_fwd, causal_lm(self.reference).lm_head.weight)
        self._pending = 0
        self._ref_pass: tuple[Batch, algo.TokenStats] | None = None

    def _build(self, factory: ModelFactory, algo_cfg: AlgoConfig, config: dict[str, Any],
               ref_config: dict[str, Any]) -> tuple[Any, Any]:
        """(policy, frozen reference or None) from a model factory; see `__init__`. Without a reference
        here the base learner copies the policy (stages 0–2) or LoRA's adapter-off view serves."""
        lora = self.cfg.lora
        if not self._zero3:
            policy = factory()
            return (apply_lora(policy, lora) if lora.enabled else policy), None
        policy = _build_partitioned(factory, config)
        if lora.enabled:  # adapters outside zero.Init: initialised from their seed exactly as on one process
            return apply_lora(policy, lora), None
        if not algo_cfg.needs_reference:
            return policy, None
        reference = _build_partitioned(factory, ref_config)
        _check_same_partitions(policy, reference)
        return policy, reference

    # ---- seams --------------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    def _sum_over_ranks(self, value: float) -> float:
        return dist.sum_over_ranks(value)

    def _max_over_ranks(self, value: int) -> int:
        return dist.max_over_ranks(value)

    def _begin_accumulation(self, micro_batches: int) -> None:
        self._pending = micro_batches

    def _backward(self, loss: Tensor) -> None:
        if self._pending <= 0:
            raise RuntimeError("DeepSpeedLearner: more backward passes than announced by _begin_accumulation")
        self._pending -= 1
        self.engine.set_gradient_accumulation_boundary(self._pending == 0)
        self.engine.backward(loss, scale_wrt_gas=False)

    def _optimizer_step(self) -> float:
        if self._pending != 0:
            raise RuntimeError(f"DeepSpeedLearner: optimizer step with {self._pending} announced backward passes "
                               "still to run")
        norm = _NAN
        if self._manual_clip:
            params = [p for p in self.policy.parameters() if p.requires_grad]
            max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.engine.step()
        if not self._manual_clip:
            norm = float(self.engine.get_global_grad_norm())
        return norm

    def _mini_batches(self, k: int) -> list[list[int]]:
        n = self.optim_cfg.mini_batches
        if n == 1:
            return [list(range(k))]
        order = torch.randperm(k, generator=self.shuffle).tolist()
        return [order[i::n] for i in range(n)]  # empty parts kept: every rank steps n times

    def _stats(self, model: Any, mb: Batch, *, compute_entropy: bool = True) -> algo.TokenStats:
        if model is self.policy:
            engine = self.engine
        elif model is self.reference and self.lora:
            with self.policy.disable_adapter():
                return self._run(self.engine, mb, compute_entropy)
        elif model is self.reference and self._ref_engine is not None:
            engine = self._ref_engine
        else:  # the local frozen reference copy (ZeRO 0–2)
            return sequence_stats(causal_lm(model), mb, chunk_size=self.optim_cfg.chunk_size,
                                  temperature=self.algo.temperature, compute_entropy=compute_entropy)
        return self._run(engine, mb, compute_entropy)

    def _actfocus_weights(self, energy: Tensor, span: Tensor, mask: Tensor) -> Tensor:
        if self.world_size == 1:
            return super()._actfocus_weights(energy, span, mask)
        # the z-score's mean and std are over the whole batch's action tokens: append the other ranks'
        # action energies as one extra row, so the algo function itself computes the global statistics
        action = mask & (span == algo.SPAN_ACTION)
        mine = energy[action].detach().double().cpu()
        others = [e for r, e in enumerate(dist.all_gather_object(mine)) if r != self.dist.rank]
        extra = torch.cat(others).to(device=energy.device, dtype=energy.dtype)
        k, width = energy.shape
        full = max(width, extra.numel())
        e = torch.zeros(k + 1, full, dtype=energy.dtype, device=energy.device)
        sp = torch.zeros(k + 1, full, dtype=span.dtype, device=span.device)
        mk = torch.zeros(k + 1, full, dtype=torch.bool, device=mask.device)
        e[:k, :width], sp[:k, :width], mk[:k, :width] = energy, span, mask
        e[k, :extra.numel()], sp[k, :extra.numel()], mk[k, :extra.numel()] = extra, algo.SPAN_ACTION, True
        w = algo.actfocus_weights(e, sp, mk, self.algo.actfocus.alpha, self.algo.actfocus.beta)
        return w[:k, :width]

    @staticmethod
    def _run(engine: Any, mb: Batch, compute_entropy: bool) -> algo.TokenStats:
        logp, entropy, energy = engine(mb.input_ids, mb.attention_mask, compute_entropy=compute_entropy)
        return algo.TokenStats(logp, entropy, energy)

    @torch.no_grad()
    def _no_grad_pass(self, model: Any, kept: Batch, micro: list[list[int]],
                      compute_entropy: bool) -> algo.TokenStats:
        out = super()._no_grad_pass(model, kept, micro, compute_entropy)
        if model is self.reference:  # kept for the global energy–reward correlation
            self._ref_pass = (kept, out)
        return out

    # ---- one update: the base update, then metrics over all ranks -----------------------------------

    def update(self, batch: Batch) -> UpdateMetrics:
        """One update on this rank's share of the batch (whole rollout groups, see
        `dist.shard_rows_by_group`); returns metrics of the whole batch, the same on every rank."""
        self._ref_pass = None
        m = super().update(batch)
        self._settle()
        corr = self._local_corr_stats()
        parts = dist.all_gather_object((m, corr))
        return _combine([p[0] for p in parts], [p[1] for p in parts])

    def _local_corr_stats(self) -> tuple[list[float], list[float]] | None:
        if self._ref_pass is None:
            return None
        kept, ref = self._ref_pass
        mask = kept.loss_mask[:, 1:].bool()
        action = mask & (kept.span[:, 1:] == algo.SPAN_ACTION)
        return group_energy_reward_stats(ref.energy, action, kept.rewards, kept.group)

    # ---- weights, checkpoints, export -------------------------------------------------------------

    def _settle(self) -> None:
        """ZeRO-3: wait for the parameter fetches DeepSpeed prefetched for a next forward that is not
        coming and re-partition everything. A gather skips parameters already in flight without
        waiting for them, so without this a weight read after an update can be an unfilled buffer
        (seen on gloo), and a process can exit with a collective still pending."""
        if self._zero3:
            for engine in (self.engine, self._ref_engine):
                if engine is not None:
                    engine.empty_partition_cache()

    def _gather(self) -> Any:
        if not self._zero3:
            return lambda params: contextlib.nullcontext()
        if self.dist.backend == "gloo":
            return _gather_one_by_one
        return lambda params: deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    def policy_state_dict(self, *, rank0_only: bool = False) -> dict[str, Tensor]:
        """Full policy weights on CPU under the plain transformers names (LoRA merged in), for the
        rollout engine's weight sync. Collective under ZeRO-3 (one layer gathered at a time): call it on
        every rank. `rank0_only`: other ranks take part in the gathers but get {} (saves their memory)."""
        self._settle()
        state = merged_state_dict(self.policy, gather=self._gather())
        return {} if rank0_only and not self.dist.is_main else state

    def export_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
        """A plain HF checkpoint of the (merged) policy, written atomically by rank 0; call on every rank."""
        state = self.policy_state_dict(rank0_only=True)
        if self.dist.is_main:
            with atomic_dir(directory) as tmp:
                save_plain_hf(causal_lm(self.policy).config, state, tmp, tokenizer)
        dist.barrier()
        return Path(directory)

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("DeepSpeedLearner's state is partitioned over ranks: use "
                        "learner.save_checkpoint(run_dir, step, extra) / learner.load_checkpoint(path)")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise TypeError("DeepSpeedLearner's state is partitioned over ranks: use learner.load_checkpoint(path)")

    def _meta(self) -> dict[str, Any]:
        return {"backend": "deepspeed", "world_size": self.world_size, "zero_stage": self.cfg.zero_stage,
                "lora": self.lora, "step": self.step}

    def _rank_state(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                               "shuffle": self.shuffle.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {"step": self.step, "rng": rng}

    def _write_shards(self, tmp: Path) -> None:
        self.engine.save_checkpoint(str(tmp), tag=DS_TAG, client_state={}, save_latest=False)
        torch.save(self._rank_state(), tmp / f"learner_rank{self.dist.rank:05d}.pt")
        if not self.dist.is_main:  # rank 0's atomic_dir syncs the tree again before the rename
            _fsync_tree(tmp)
        dist.barrier()

    def save_checkpoint(self, run_dir: str | os.PathLike[str], step: int, extra: dict[str, Any] | None = None, *,
                        keep_last: int = 0) -> Path:
        """Checkpoint `step` of `run_dir` (`<run_dir>/checkpoints/step_XXXXXXXX/`): DeepSpeed's per-rank
        shards + each rank's RNGs, and `extra` (rank 0's, e.g. the loop's RNG and step) in state.pt.
        Atomic: every rank writes into rank 0's temporary directory, which rank 0 renames into place
        once all are done. Call on every rank; keeps the newest `keep_last` checkpoints when > 0."""
        root = checkpoint_root(run_dir)
        final = root / f"step_{step:08d}"
        if self.dist.is_main:
            for stale in root.glob(".tmp-*") if root.is_dir() else ():
                shutil.rmtree(stale, ignore_errors=True)
            with atomic_dir(final) as tmp:
                dist.broadcast_object(str(tmp))
                self._write_shards(tmp)
                torch.save({"learner": self._meta(), **(extra or {})}, tmp / STATE_FILE)
            if keep_last > 0:
                for _, old in list_checkpoints(run_dir)[:-keep_last]:
                    shutil.rmtree(old, ignore_errors=True)
        else:
            self._write_shards(Path(dist.broadcast_object(None)))
        dist.barrier()  # nobody returns before the checkpoint is in place
        return final

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore model, optimizer, LR schedule, step and RNGs from a checkpoint written by
        `save_checkpoint` (same world size, ZeRO stage and LoRA setting); returns its `extra`."""
        path = Path(path)
        f = path / STATE_FILE
        if not f.is_file():
            raise FileNotFoundError(f"{f} does not exist: not a complete checkpoint")
        state = torch.load(f, map_location="cpu", weights_only=False)
        meta = state.pop("learner")
        want = {k: v for k, v in self._meta().items() if k != "step"}
        have = {k: meta.get(k) for k in want}
        if have != want:
            raise ValueError(f"checkpoint {path} was written by a learner with {have}, this one has {want}: "
                             "resume with the same number of processes, learner.zero_stage and learner.lora")
        load_path, _ = self.engine.load_checkpoint(str(path), tag=DS_TAG, load_optimizer_states=True,
                                                   load_lr_scheduler_states=True)
        if load_path is None:
            raise FileNotFoundError(f"DeepSpeed found no shards under {path / DS_TAG}")
        rank = torch.load(path / f"learner_rank{self.dist.rank:05d}.pt", map_location="cpu", weights_only=False)
        self.step = int(rank["step"])
        rng = rank["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        self.shuffle.set_state(rng["shuffle"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return state


# ---- metrics of the whole batch from the ranks' shares ------------------------------------------------


def _wmean(values: list[float], weights: list[float]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if w > 0 and not math.isnan(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else _NAN


def _combine(ms: list[UpdateMetrics], corr: list[tuple[list[float], list[float]] | None]) -> UpdateMetrics:
    """Global UpdateMetrics: counts summed; loss-type fields are per-rank shares of each step (summed);
    means weighted by what they average over; extremes min/max; the energy–reward correlation
    recomputed over all groups."""
    if len(ms) == 1 and corr[0] is None:
        return ms[0]
    m0 = ms[0]
    tok = [float(m.tokens) for m in ms]
    eps = [float(m.episodes) for m in ms]
    kept = [float(m.episodes_kept) for m in ms]
    act = [m.tokens * (m.action_token_share if not math.isnan(m.action_token_share) else 0.0) for m in ms]
    rea = [t - a for t, a in zip(tok, act, strict=True)]
    out: dict[str, Any] = {
        "episodes": sum(m.episodes for m in ms), "episodes_kept": sum(m.episodes_kept for m in ms),
        "tokens": sum(m.tokens for m in ms), "micro_batches": max(m.micro_batches for m in ms),
        "reward_mean": _wmean([m.reward_mean for m in ms], eps),
        "reward_shaped_mean": _wmean([m.reward_shaped_mean for m in ms], eps),
        "advantage_mean": _wmean([m.advantage_mean for m in ms], kept),
        "advantage_abs_mean": _wmean([m.advantage_abs_mean for m in ms], kept),
        "entropy": _wmean([m.entropy for m in ms], tok),
        "aem_alpha_mean": _wmean([m.aem_alpha_mean for m in ms], kept),
        "aem_alpha_min": min(m.aem_alpha_min for m in ms), "aem_alpha_max": max(m.aem_alpha_max for m in ms),
        "actfocus_weight_action": _wmean([m.actfocus_weight_action for m in ms], act),
        "actfocus_weight_reasoning": _wmean([m.actfocus_weight_reasoning for m in ms], rea),
        "actfocus_weight_min": min(m.actfocus_weight_min for m in ms),
        "actfocus_weight_max": max(m.actfocus_weight_max for m in ms),
        "action_token_share": sum(act) / sum(tok) if sum(tok) else _NAN,
        "energy_action": _wmean([m.energy_action for m in ms], act),
        "energy_reasoning": _wmean([m.energy_reasoning for m in ms], rea),
        "update_s": max(m.update_s for m in ms),
        # token-weighted over ranks (exact at level token; at the sequence levels a close weighting)
        "is_ratio_mean": _wmean([m.is_ratio_mean for m in ms], tok),
        "is_ratio_max": max(m.is_ratio_max for m in ms),
        "is_capped_fraction": _wmean([m.is_capped_fraction for m in ms], tok),
        "mismatch_kl_k1": _wmean([m.mismatch_kl_k1 for m in ms], tok),
        "mismatch_kl_k3": _wmean([m.mismatch_kl_k3 for m in ms], tok),
    }
    if not m0.skipped:
        for k in ("loss", "pg_loss", "kl", "clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"):
            out[k] = sum(getattr(m, k) for m in ms)
    out["tokens_per_s"] = sum(m.tokens_per_s * m.update_s for m in ms) / out["update_s"] if out["update_s"] else 0.0
    if m0.skipped:  # the base reports 1.0 / NaN placeholders then; keep them
        for k in ("aem_alpha_mean", "actfocus_weight_action", "actfocus_weight_reasoning", "entropy",
                  "energy_action", "energy_reasoning"):
            out[k] = getattr(m0, k)
    if all(c is not None for c in corr):
        energies = [e for c in corr for e in c[0]]  # type: ignore[index]
        variances = [v for c in corr for v in c[1]]  # type: ignore[index]
        pearson, spearman = energy_reward_correlation(energies, variances)
        out.update(energy_reward_corr_pearson=pearson, energy_reward_corr_spearman=spearman,
                   energy_reward_corr_groups=sum(math.isfinite(e) for e in energies))
    known = {f.name for f in fields(UpdateMetrics)}
    return replace(m0, **{k: v for k, v in out.items() if k in known})


__all__ = ["DeepSpeedLearner", "build_ds_config", "zero3_construction"]

