"""The learner on DeepSpeed: data-parallel ZeRO 0–3 over the ranks torchrun started (nccl on GPUs,
gloo on CPU), bf16, gradient checkpointing, optimizer / parameter offload, LoRA.

`DeepSpeedBackend` is the `LearnerBackend` (`swerl.learner.backend`) the one `Learner` runs on here:
  * every forward goes through the DeepSpeed engine. The engine wraps `_StatsForward`, a module whose
    forward is `sequence_stats` (final hidden states → chunked log-prob / entropy / energy, never full
    logits, the head at the loss tokens only); under ZeRO-3 the LM head weight is registered as an
    external parameter of that module, so DeepSpeed gathers it for the statistics and again for their
    backward.
  * `backward`: `engine.backward(loss, scale_wrt_gas=False)` (the learner already scales each
    micro-batch's loss so that the sum over micro-batches, averaged over ranks by DeepSpeed, is the
    full-batch loss); the learner announces how many backward passes an optimizer step has
    (`begin_accumulation`), and the last one is marked as the gradient-accumulation boundary, where
    ZeRO 0/1 all-reduce and ZeRO 2/3 finish their reduce-scatter. DeepSpeed's own accumulation
    counter is set to 1 and overridden by that flag, so one `step` is one real step however many
    micro-batches it had.
  * `step`: `engine.step()` (DeepSpeed clips at `gradient_clipping`, steps the optimizer and the
    LambdaLR, zeroes grads); the reported norm is DeepSpeed's pre-clip global norm. With no ZeRO /
    bf16 wrapper (stage 0, fp32) DeepSpeed clips without keeping the norm, so the backend clips
    itself (gradients are already all-reduced there) and DeepSpeed's clipping is off.
  * `sum_over_ranks` / `max_over_ranks` / `all_gather`: collectives on the process group; the world
    is `collective`, so the learner combines its metrics over the ranks.

Construction: the learner takes a built model, or a model factory (a zero-argument callable that
builds the causal LM; `swerl.learner.backend.ModelFactory`). Under ZeRO-3 a factory is called inside
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

Checkpoints: `save_checkpoint(run_dir, step, rank_state, extra)` writes DeepSpeed's per-rank shards (model and
optimizer partitions, LR schedule) plus each rank's RNG / shuffle state into one temporary directory,
and rank 0 renames it into place after every rank is done (`checkpoint.atomic_dir`), so a checkpoint
is complete or absent. With no shared filesystem (`storage`, probed by `dist.probe_storage`: each node
sees its own run directory), each node's first rank makes and completes the node's own checkpoint
directory, its ranks write their shards there, and DeepSpeed writes the node-wide files on every node
(`checkpoint.use_node_local_storage`), so each node resumes from its own disk. Resume needs the same
world size, ZeRO stage and LoRA setting.

Offload needs DeepSpeed's CPUAdam (ZeRO-Offload rejects torch optimizers); its C++ extension compiles
on first use (~90 s), so the CPU tests do not exercise it.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import torch
from torch import Tensor

from swerl import algo
from swerl.learner import dist
from swerl.learner.backend import (
    ModelFactory,
    World,
    adamw,
    loss_positions,
    lr_schedule,
    place_models,
    sequence_stats,
    trainable,
)
from swerl.learner.batch import Batch
from swerl.learner.checkpoint import STATE_FILE, _fsync_tree, atomic_dir, checkpoint_root, list_checkpoints
from swerl.learner.config import AlgoConfig, LearnerConfig, OptimConfig
from swerl.learner.lora import (
    AdapterDisabledReference,
    apply_lora,
    causal_lm,
    is_peft,
    iter_merged_weights,
    merged_state_dict,
    merged_weight_meta,
    save_plain_hf,
)
from swerl.learner.weights import WeightBucket, WeightMeta, bucketed

DS_TAG = "deepspeed"
_NAN = float("nan")


@dataclass(frozen=True)
class _Rows:
    """What `sequence_stats` reads of a Batch."""

    input_ids: Tensor
    attention_mask: Tensor


class _StatsForward(torch.nn.Module):
    """The module DeepSpeed runs: (input_ids, attention_mask, where) → (logp, entropy | None, energy) of the
    wrapped causal LM (see `sequence_stats`)."""

    def __init__(self, lm: Any, *, chunk_size: int, temperature: float) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.temperature = temperature

    def forward(self, input_ids: Tensor, attention_mask: Tensor, where: Tensor | None = None,
                compute_entropy: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
        s = sequence_stats(causal_lm(self.lm), _Rows(input_ids, attention_mask), chunk_size=self.chunk_size,
                           temperature=self.temperature, compute_entropy=compute_entropy, where=where)
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
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "train_batch_size": world_size, "zero_optimization": zero, "bf16": {"enabled": cfg.bf16},
              "steps_per_print": 2**31 - 1}
    over = {k: v for k, v in (overrides or {}).items() if k in ("zero_optimization",)}
    if "zero_optimization" in over:  # only the partitioning knobs apply to an optimizer-less engine
        over = {"zero_optimization": {k: v for k, v in over["zero_optimization"].items()
                                      if k.startswith("stage3_")}}
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
        raise TypeError(f"the model factory returned {type(model).__name__}, not a torch module (a causal "
                        "LM)")
    whole = [name for name, p in model.named_parameters() if not hasattr(p, "ds_id")]
    if whole:
        raise ValueError(f"the model factory returned a model with parameters that are not ZeRO-3 partitions "
                         f"({', '.join(whole[:3])}{', ...' if len(whole) > 3 else ''}): it must construct "
                         "the model when called (e.g. `lambda: AutoModelForCausalLM.from_pretrained(path)`), "
                         "not return one built before")
    return model


def _check_same_partitions(policy: Any, reference: Any) -> None:
    """The reference (a second factory call) must start as the policy: compare each rank's partitions
    (no gathering) and agree over ranks. A factory with an unseeded random init fails here."""
    pol, ref = dict(policy.named_parameters()), dict(reference.named_parameters())
    same = (pol.keys() == ref.keys()
            and all(torch.equal(p.ds_tensor, ref[k].ds_tensor) for k, p in pol.items()))
    if dist.sum_over_ranks(0.0 if same else 1.0) > 0:
        raise ValueError("the model factory built different weights on its second call (the frozen reference "
                         "model): it must build the same model every call (load a checkpoint, or seed a "
                         "random init)")


class DeepSpeedBackend:
    """`LearnerBackend` on a DeepSpeed engine; one instance per rank, every method called on every rank
    (the forwards, steps, weight gathers and checkpoint writes are collective)."""

    def __init__(self, model: torch.nn.Module | ModelFactory, algo_cfg: AlgoConfig, optim: OptimConfig,
                 learner_cfg: LearnerConfig, *, device: str = "cpu", total_steps: int | None = None,
                 ds_overrides: dict[str, Any] | None = None, storage: dist.Storage | None = None) -> None:
        """`model`: a transformers causal LM, or a peft model (`swerl.learner.lora.apply_lora`) to train
        only its adapters; identical on every rank. Or a `ModelFactory`: a zero-argument callable that
        builds the causal LM, the same weights on every call and rank (a checkpoint, or a seeded init),
        in the training dtype (bf16 with learner_cfg.bf16; DeepSpeed keeps fp32 master weights). Under
        ZeRO-3 it is called inside `zero3_construction`, for the policy and again for the frozen
        reference, so no rank holds a whole model; else once. Its model gets LoRA adapters here when
        learner_cfg.lora.enabled (after the partitioned construction, as plain small tensors the
        engine then partitions). `device`: cpu, or cuda (this rank's `cuda:<local_rank>`).
        `ds_overrides`: merged into the built DeepSpeed config (tuning knobs). `storage`: which ranks share
        the run directory (`dist.probe_storage`; None: all of them).
        Needs a live process group: `with swerl.learner.dist.init_distributed(required=True): ...`."""
        if not torch.distributed.is_initialized():
            raise RuntimeError("the DeepSpeed learner needs a process group: create the learner inside "
                               "`with swerl.learner.dist.init_distributed(cfg.dist_backend, required=True):` "
                               "(under torchrun, or as a single process)")
        if not isinstance(model, torch.nn.Module) and not callable(model):
            raise TypeError("model must be a causal LM (a torch module) or a zero-argument callable that "
                            f"builds one, got {type(model).__name__}")
        self.cfg = learner_cfg
        self.dist = dist.info()
        self.storage = storage or dist.Storage((0,) * self.dist.world_size)
        if len(self.storage.leaders) != self.dist.world_size:
            raise ValueError(f"storage names {len(self.storage.leaders)} ranks, the process group has "
                             f"{self.dist.world_size}")
        if not self.storage.shared:  # every node writes (and later reads) the node-wide files itself
            ds_overrides = _merge({"checkpoint": {"use_node_local_storage": True}}, ds_overrides or {})
        self._world = World(rank=self.dist.rank, size=self.dist.world_size, collective=True)
        self._optim = optim
        cuda = device.startswith("cuda")
        if cuda and ":" not in device:
            device = f"cuda:{self.dist.local_rank}"
        self._device = torch.device(device)
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
        self._policy, self._reference = place_models(model, algo_cfg, optim, self._device, reference=ref)
        if learner_cfg.offload_optimizer:  # ZeRO-Offload rejects torch optimizers
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            self._optimizer: torch.optim.Optimizer = DeepSpeedCPUAdam(
                trainable(self._policy), lr=optim.lr, betas=optim.betas, eps=optim.eps,
                weight_decay=optim.weight_decay, adamw_mode=True)
        else:
            self._optimizer = adamw(self._policy, optim)
        self.scheduler = lr_schedule(self._optimizer, optim, total_steps)
        self._forward = _StatsForward(self._policy, chunk_size=optim.chunk_size,
                                      temperature=algo_cfg.temperature)
        self.engine, _, _, _ = deepspeed.initialize(model=self._forward, optimizer=self._optimizer,
                                                    lr_scheduler=self.scheduler, config=config)
        if self._zero3:
            deepspeed.zero.register_external_parameter(self._forward, causal_lm(self._policy).lm_head.weight)
        self._ref_engine: Any = None
        self._chunk_size, self._temperature = optim.chunk_size, algo_cfg.temperature
        if self._reference is not None and not self.lora:
            if learner_cfg.bf16:
                self._reference.to(torch.bfloat16)
            if self._zero3:
                ref_fwd = _StatsForward(self._reference, chunk_size=optim.chunk_size,
                                        temperature=algo_cfg.temperature)
                self._ref_engine, _, _, _ = deepspeed.initialize(model=ref_fwd, config=ref_config)
                deepspeed.zero.register_external_parameter(ref_fwd, causal_lm(self._reference).lm_head.weight)
        self._pending = 0

    def _build(self, factory: ModelFactory, algo_cfg: AlgoConfig, config: dict[str, Any],
               ref_config: dict[str, Any]) -> tuple[Any, Any]:
        """(policy, frozen reference or None) from a model factory; see `__init__`. Without a reference
        here `place_models` copies the policy (stages 0–2) or LoRA's adapter-off view serves."""
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

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def world(self) -> World:
        return self._world

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
        if model is self._policy:
            return self._run(self.engine, batch, compute_entropy)
        if isinstance(model, AdapterDisabledReference):  # LoRA: the policy engine, adapters off
            with model.adapters_off():
                return self._run(self.engine, batch, compute_entropy)
        if self._ref_engine is not None:
            return self._run(self._ref_engine, batch, compute_entropy)
        # the local frozen reference copy (ZeRO 0–2): no communication
        return sequence_stats(causal_lm(model), batch, chunk_size=self._chunk_size,
                              temperature=self._temperature, compute_entropy=compute_entropy,
                              where=loss_positions(batch))

    @staticmethod
    def _run(engine: Any, mb: Batch, compute_entropy: bool) -> algo.TokenStats:
        logp, entropy, energy = engine(mb.input_ids, mb.attention_mask, loss_positions(mb),
                                       compute_entropy=compute_entropy)
        return algo.TokenStats(logp, entropy, energy)

    def begin_accumulation(self, backward_passes: int) -> None:
        self._pending = backward_passes

    def backward(self, loss: Tensor) -> None:
        if self._pending <= 0:
            raise RuntimeError("DeepSpeedBackend: more backward passes than announced by begin_accumulation")
        self._pending -= 1
        self.engine.set_gradient_accumulation_boundary(self._pending == 0)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        if self._pending != 0:
            raise RuntimeError(f"DeepSpeedBackend: optimizer step with {self._pending} announced backward "
                               "passes still to run")
        norm = _NAN
        if self._manual_clip:
            max_norm = self._optim.grad_clip if self._optim.grad_clip > 0 else math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(trainable(self._policy), max_norm))
        self.engine.step()
        if not self._manual_clip:
            norm = float(self.engine.get_global_grad_norm())
        return norm

    def sum_over_ranks(self, value: float) -> float:
        return dist.sum_over_ranks(value)

    def max_over_ranks(self, value: int) -> int:
        return dist.max_over_ranks(value)

    def all_gather(self, obj: Any) -> list[Any]:
        return dist.all_gather_object(obj)

    def settle(self) -> None:
        """ZeRO-3: wait for the parameter fetches DeepSpeed prefetched for a next forward that is not
        coming and re-partition everything. A gather skips parameters already in flight without
        waiting for them, so without this a weight read after an update can be an unfilled buffer
        (seen on gloo), and a process can exit with a collective still pending."""
        if self._zero3:
            for engine in (self.engine, self._ref_engine):
                if engine is not None:
                    engine.empty_partition_cache()

    # ---- weights, checkpoints, export -------------------------------------------------------------

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
        self.settle()
        state = merged_state_dict(self._policy, gather=self._gather())
        return {} if rank0_only and not self.dist.is_main else state

    def iter_weight_buckets(self, bucket_bytes: int, *,
                            device: torch.device | str = "cpu") -> Iterator[WeightBucket]:
        """The policy's weights in buckets of at most `bucket_bytes` (`policy_state_dict`'s names, a tied
        weight once), copied to `device`. Under ZeRO-3 each module is gathered, copied and released
        before the next (the gather `policy_state_dict` uses), so no rank ever holds more than one
        module gathered plus one bucket. Collective: every rank must drain it (others may drop the
        buckets)."""
        self.settle()
        return bucketed(iter_merged_weights(self._policy, gather=self._gather(), device=device),
                        bucket_bytes)

    def weight_meta(self) -> list[WeightMeta]:
        """What `iter_weight_buckets` yields, name by name, read without gathering (ZeRO-3 `ds_shape`)."""
        return merged_weight_meta(self._policy)

    def export_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
        """A plain HF checkpoint of the (merged) policy, written atomically by rank 0; call on every rank."""
        state = self.policy_state_dict(rank0_only=True)
        if self.dist.is_main:
            with atomic_dir(directory) as tmp:
                save_plain_hf(causal_lm(self._policy).config, state, tmp, tokenizer)
        dist.barrier()
        return Path(directory)

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("the DeepSpeed learner's state is partitioned over ranks: use "
                        "learner.save_checkpoint(run_dir, step, extra) / learner.load_checkpoint(path)")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise TypeError("the DeepSpeed learner's state is partitioned over ranks: use "
                        "learner.load_checkpoint(path)")

    def _meta(self) -> dict[str, Any]:
        """What a resume must match (the step is informational)."""
        return {"backend": "deepspeed", "world_size": self.dist.world_size, "zero_stage": self.cfg.zero_stage,
                "lora": self.lora}

    def _write_shards(self, tmp: Path, rank_state: dict[str, Any]) -> None:
        self.engine.save_checkpoint(str(tmp), tag=DS_TAG, client_state={}, save_latest=False)
        torch.save(rank_state, tmp / f"learner_rank{self.dist.rank:05d}.pt")
        if not self.dist.is_main:  # rank 0's atomic_dir syncs the tree again before the rename
            _fsync_tree(tmp)
        dist.barrier()

    def save_checkpoint(self, run_dir: str | os.PathLike[str], step: int, rank_state: dict[str, Any],
                        extra: dict[str, Any], *, keep_last: int) -> Path:
        """Checkpoint `step` of `run_dir` (`<run_dir>/checkpoints/step_XXXXXXXX/`): DeepSpeed's per-rank
        shards + each rank's `rank_state` (step, RNGs), and `extra` (the loop's RNG and step) in state.pt.
        Atomic: the ranks that share a run directory (all of them, or a node's, see `storage`) write into
        their first rank's temporary directory, which it renames into place once all are done. Call on
        every rank; keeps the newest `keep_last` checkpoints when > 0."""
        root = checkpoint_root(run_dir)
        final = root / f"step_{step:08d}"
        rank = self.dist.rank
        if self.storage.leader(rank) == rank:
            for stale in root.glob(".tmp-*") if root.is_dir() else ():
                shutil.rmtree(stale, ignore_errors=True)
            with atomic_dir(final) as tmp:
                dist.all_gather_object(str(tmp))
                self._write_shards(tmp, rank_state)
                meta = {**self._meta(), "step": rank_state["step"]}
                torch.save({"learner": meta, **extra}, tmp / STATE_FILE)
            if keep_last > 0:
                for _, old in list_checkpoints(run_dir)[:-keep_last]:
                    shutil.rmtree(old, ignore_errors=True)
        else:
            tmps = dist.all_gather_object(None)
            self._write_shards(Path(tmps[self.storage.leader(rank)]), rank_state)
        dist.barrier()  # nobody returns before the checkpoint is in place
        return final

    def load_checkpoint(self, path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore model, optimizer and LR schedule from a checkpoint written by `save_checkpoint`
        (same world size, ZeRO stage and LoRA setting); (this rank's state, `extra`)."""
        path = Path(path)
        f = path / STATE_FILE
        if not f.is_file():
            raise FileNotFoundError(f"{f} does not exist: not a complete checkpoint")
        state = torch.load(f, map_location="cpu", weights_only=False)
        meta = state.pop("learner")
        want = self._meta()
        have = {k: meta.get(k) for k in want}
        if have != want:
            raise ValueError(f"checkpoint {path} was written by a learner with {have}, this one has {want}: "
                             "resume with the same number of processes, learner.zero_stage and learner.lora")
        load_path, _ = self.engine.load_checkpoint(str(path), tag=DS_TAG, load_optimizer_states=True,
                                                   load_lr_scheduler_states=True)
        if load_path is None:
            raise FileNotFoundError(f"DeepSpeed found no shards under {path / DS_TAG}")
        rank = torch.load(path / f"learner_rank{self.dist.rank:05d}.pt", map_location="cpu",
                          weights_only=False)
        return rank, state


__all__ = ["DeepSpeedBackend", "build_ds_config", "zero3_construction"]
