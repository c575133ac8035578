"""One rank of the DeepSpeed learner tests (launched by tests/learner/test_learner_deepspeed.py).

    .venv/bin/torchrun --nproc_per_node 2 tests/learner/ds_worker.py --out DIR [--cases z0,z2] [--resume]
    .venv/bin/python tests/learner/ds_worker.py --out DIR --cases z2          # world 1 (no launcher)

For each case: a Learner on the DeepSpeed backend over the ranks (toy Qwen2, fp32, gloo) takes one
update on this rank's whole rollout groups of a fixed batch; rank 0 writes the update's metrics and the
policy's full weights to DIR/<case>.pt. Checkpoint cases then save a checkpoint under DIR/run-<case>,
take a second update and write DIR/<case>-next.pt; with --resume a fresh learner loads that checkpoint
and takes the same second update, written to DIR/<case>-resumed.pt. The test compares all of it with
the single-process `Learner` on the full batch.

The FACTORY_CASES build the learner from a model factory (under ZeRO-3 the policy and the reference are
constructed partitioned; tests/learner/test_learner_zero3_init.py); `memory` and `errors` are that file's
construction probes (see `run_memory`, `run_errors`); `buckets` streams the partitioned policy's weights
in buckets (`run_buckets`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import resource
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from swerl.learner import (
    ActFocusConfig,
    AEMConfig,
    AlgoConfig,
    KLConfig,
    LearnerConfig,
    LoRAConfig,
    OptimConfig,
    make_learner,
)
from swerl.learner.dist import init_distributed, shard_rows_by_group

FULL = dict(aem=AEMConfig(enabled=True, lam=2.0), actfocus=ActFocusConfig(enabled=True, alpha=0.3, beta=0.5),
            kl=KLConfig(coef=0.1), clip_high=0.28)
# ZeRO-3 partitions every parameter (the toy model's are all under DeepSpeed's default persistence
# threshold, which would leave them whole and the gather paths unexercised)
PARTITION_ALL = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}

# name → (algo, optim, learner config, DeepSpeed overrides, checkpointed)
CASES: dict[str, tuple[AlgoConfig, OptimConfig, LearnerConfig, dict, bool]] = {
    # several micro-batches per rank, unequal counts over ranks (empty slots), plain GRPO
    "z0": (AlgoConfig(), OptimConfig(lr=1e-2, micro_batch_tokens=24),
           LearnerConfig(backend="deepspeed", zero_stage=0), {}, False),
    "z1": (AlgoConfig(kl=KLConfig(coef=0.1)), OptimConfig(lr=1e-2, micro_batch_tokens=40, grad_clip=0.5),
           LearnerConfig(backend="deepspeed", zero_stage=1), {}, False),
    # 2 epochs × 2 mini-batches = 4 optimizer steps, AEM + ActFocus + KL, seq-mean aggregation
    "z2": (AlgoConfig(**FULL, loss_agg="seq-mean-token-mean"),
           OptimConfig(lr=1e-2, micro_batch_tokens=40, ppo_epochs=2, mini_batches=2, lr_schedule="cosine",
                       warmup_steps=1),
           LearnerConfig(backend="deepspeed", zero_stage=2), {}, True),
    # partitioned policy and reference engines, gradient checkpointing, 2 epochs, small micro-batches
    "z3": (AlgoConfig(**FULL),
           OptimConfig(lr=1e-2, micro_batch_tokens=30, ppo_epochs=2, gradient_checkpointing=True),
           LearnerConfig(backend="deepspeed", zero_stage=3), PARTITION_ALL, True),
    # LoRA on ZeRO-3: the reference is the policy engine with adapters disabled
    "z3_lora": (AlgoConfig(kl=KLConfig(coef=0.5)), OptimConfig(lr=5e-2, micro_batch_tokens=40),
                LearnerConfig(backend="deepspeed", zero_stage=3,
                              lora=LoRAConfig(enabled=True, r=4, alpha=8.0)),
                PARTITION_ALL, False),
    # one micro-batch per rank and one optimizer step: AEM's entropies come from the loss pass itself
    # (no pre-pass forward on any rank, so ZeRO-3's gathers stay in step)
    "z3_aem1": (AlgoConfig(**FULL), OptimConfig(lr=1e-2, micro_batch_tokens=4096),
                LearnerConfig(backend="deepspeed", zero_stage=3), PARTITION_ALL, False),
    # bf16 weights and activations (fp32 master weights), the z3 algorithm
    "z3_bf16": (AlgoConfig(**FULL), OptimConfig(lr=1e-2, micro_batch_tokens=30),
                LearnerConfig(backend="deepspeed", zero_stage=3, bf16=True), PARTITION_ALL, False),
}
# ZeRO-3 from a model factory: name → how the factory builds the toy model. "init": its constructor
# (Qwen2ForCausalLM(config), seeded) run under zero.Init; "hf": from_pretrained of it saved as an HF
# checkpoint (DIR/toy-hf), loaded into the partitions by transformers
FACTORY_CASES = {"z3_factory": "init", "z3_factory_hf": "hf", "z3_factory_lora": "init",
                 "z3_factory_bf16": "init"}
CASES.update({
    # the z3 case (KL + ActFocus: a partitioned reference too; gradient checkpointing, 2 epochs)
    "z3_factory": (*CASES["z3"][:4], False),
    "z3_factory_hf": (AlgoConfig(kl=KLConfig(coef=0.1)), OptimConfig(lr=1e-2, micro_batch_tokens=40),
                      LearnerConfig(backend="deepspeed", zero_stage=3), PARTITION_ALL, False),
    # adapters put on the partitioned base by the learner (B = 0: they start as the base model)
    "z3_factory_lora": (AlgoConfig(kl=KLConfig(coef=0.5)), OptimConfig(lr=5e-2, micro_batch_tokens=40),
                        LearnerConfig(backend="deepspeed", zero_stage=3,
                                      lora=LoRAConfig(enabled=True, r=4, alpha=8.0)),
                        PARTITION_ALL, False),
    # the factory builds in bf16 (the training dtype)
    "z3_factory_bf16": (*CASES["z3_bf16"][:4], False),
})
EXPORTED = ("z3", "z3_lora")  # cases whose policy is also exported in HF format
TOTAL_STEPS = 12


def batches():
    from test_learner import _batch

    return _batch(seed=3, groups=4, n=4), _batch(seed=4, groups=4, n=4)


def model(seed: int = 7):
    from test_learner import _model

    return _model(seed=seed)


def local(batch, rank: int, world: int):
    rows = shard_rows_by_group(batch.group.tolist(), rank, world, lengths=batch.lengths.tolist())
    return batch.select(rows)


def lora_model(cfg: LoRAConfig):
    """The toy model with adapters whose B matrices are non-zero (peft starts them at 0, where policy =
    reference and the KL is 0); built before any learner, so every rank and the reference run agree."""
    from swerl.learner.lora import apply_lora

    peft_model = apply_lora(model(), cfg)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return peft_model


def factory(name: str, out: Path) -> Callable[[], Any]:
    """The model factory of a FACTORY_CASES case: the toy model (seed 7) in the case's training dtype."""
    dtype = torch.bfloat16 if CASES[name][2].bf16 else torch.float32
    if FACTORY_CASES[name] == "hf":
        from transformers import AutoModelForCausalLM

        return lambda: AutoModelForCausalLM.from_pretrained(out / "toy-hf", dtype=dtype)
    return lambda: model().to(dtype)


def build(name: str, out: Path):
    algo, optim, lcfg, over, _ = CASES[name]
    if name in FACTORY_CASES:
        return make_learner(factory(name, out), algo, optim, lcfg, device="cpu", total_steps=TOTAL_STEPS,
                            ds_overrides=over)
    if lcfg.lora.enabled:  # make_learner would wrap a fresh model; start from the prepared adapters instead
        from swerl.learner import Learner
        from swerl.learner.ds_learner import DeepSpeedBackend

        return Learner(DeepSpeedBackend(lora_model(lcfg.lora), algo, optim, lcfg, device="cpu",
                                        total_steps=TOTAL_STEPS, ds_overrides=over), algo, optim)
    return make_learner(model(), algo, optim, lcfg, device="cpu", total_steps=TOTAL_STEPS, ds_overrides=over)


def run_case(name: str, out: Path, info, *, resume: bool) -> None:
    ckpt = CASES[name][4]
    b1, b2 = batches()
    learner = build(name, out)
    run_dir = out / f"run-{name}"
    if resume:
        from swerl.learner.checkpoint import latest_checkpoint

        extra = learner.load_checkpoint(latest_checkpoint(run_dir))
        m = learner.update(local(b2, info.rank, info.world_size))
        dump(out / f"{name}-resumed.pt", learner, m, info, extra=extra)
        return
    forwards = [0]
    # sequence_stats runs the backbone (`model.model`) and the chunked head: count backbone forwards
    hook = learner.policy.model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    m = learner.update(local(b1, info.rank, info.world_size))
    hook.remove()
    dump(out / f"{name}.pt", learner, m, info, policy_forwards=forwards[0])
    if name in EXPORTED:
        learner.export_hf(out / f"export-{name}")
        with torch.no_grad():  # the policy's own log-probs on the full batch (a collective forward)
            logp = learner._stats(learner.policy, b1, compute_entropy=False).logp
        if info.is_main:
            torch.save(logp, out / f"logp-{name}.pt")
    if ckpt:
        learner.save_checkpoint(run_dir, learner.step, {"train_step": 1, "note": name}, keep_last=1)
        m = learner.update(local(b2, info.rank, info.world_size))
        dump(out / f"{name}-next.pt", learner, m, info)


def dump(path: Path, learner, m, info, **extra) -> None:
    params = learner.policy_state_dict(rank0_only=True)  # collective: every rank calls it
    if info.is_main:
        torch.save({"metrics": dataclasses.asdict(m), "params": params, "world_size": info.world_size,
                    "step": learner.step, **extra}, path)


# ---- construction probes (tests/learner/test_learner_zero3_init.py) --------------------------------------

# big enough that one module (the 4096 × 256 embedding, 1/5 of the weights) is far from the whole model
MEMORY_MODEL = dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                    intermediate_size=1024, seed=5)


def memory_model():
    from swerl.models import make_toy_model

    kw = dict(MEMORY_MODEL)
    return make_toy_model(kw.pop("vocab_size"), **kw)


class ParamProbe:
    """Measures, while open, the largest number of parameter bytes this process holds materialised at
    once: the sum of `p.data` over every parameter created so far (a ZeRO-3 partitioned one holds an
    empty `data`; its partition lives in `ds_tensor`). Sampled whenever a module registers a parameter
    and whenever a ZeRO-3 gather has made parameters whole (transformers' init and checkpoint loading
    write into gathered parameters), so both construction and the gathers during it are seen."""

    def __init__(self) -> None:
        self.params: dict[int, weakref.ref] = {}
        self.peak = 0

    def _sample(self) -> None:
        alive = [r() for r in self.params.values()]
        self.peak = max(self.peak,
                        sum(p.data.numel() * p.data.element_size() for p in alive if p is not None))

    @contextlib.contextmanager
    def watch(self) -> Iterator[ParamProbe]:
        import deepspeed

        def on_register(module: torch.nn.Module, name: str, param: Any) -> None:
            if param is not None:
                self.params[id(param)] = weakref.ref(param)
                self._sample()

        gathered = deepspeed.zero.GatheredParameters
        enter = gathered.__enter__

        def enter_and_sample(ctx: Any) -> Any:
            out = enter(ctx)
            self._sample()
            return out

        handle = torch.nn.modules.module.register_module_parameter_registration_hook(on_register)
        gathered.__enter__ = enter_and_sample
        try:
            yield self
        finally:
            gathered.__enter__ = enter
            handle.remove()


def probed(build: Callable[[], Any], calls: list[dict]) -> Callable[[], Any]:
    """`build` as a model factory that records, per call, the probe's peak, the model's full parameter
    bytes, what stays materialised and this rank's partition sizes, and the process's peak RSS."""

    def call() -> Any:
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with ParamProbe().watch() as probe:
            m = build()
        params = dict(m.named_parameters())  # a tied weight once
        calls.append({
            "peak_param_bytes": probe.peak,
            "full_bytes": sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in params.values()),
            "materialised_bytes": sum(p.data.numel() * p.element_size() for p in params.values()),
            "partition_numel": {k: p.ds_tensor.numel() for k, p in params.items() if hasattr(p, "ds_tensor")},
            "full_numel": {k: getattr(p, "ds_numel", p.numel()) for k, p in params.items()},
            "maxrss_kib_before": rss0, "maxrss_kib_after": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        })
        return m

    return call


def run_memory(out: Path, info) -> None:
    """Build learners on MEMORY_MODEL from probed factories: ZeRO-3 from the constructor and from an HF
    checkpoint of it, ZeRO-2 (a full copy per rank) for contrast; each rank writes
    DIR/memory-rank<r>.pt with the factory calls' records."""
    from transformers import AutoModelForCausalLM

    hf_dir = out / "memory-hf"
    if info.is_main:
        memory_model().save_pretrained(hf_dir)
    torch.distributed.barrier()
    algo = AlgoConfig(kl=KLConfig(coef=0.1))  # a reference model is needed
    records: dict[str, list[dict]] = {}
    for key, stage, build in (("z3_init", 3, memory_model),
                              ("z3_hf", 3,
                               lambda: AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)),
                              ("z2_init", 2, memory_model)):
        calls: list[dict] = []
        learner = make_learner(probed(build, calls), algo, OptimConfig(), LearnerConfig(backend="deepspeed",
                               zero_stage=stage), device="cpu", ds_overrides=PARTITION_ALL)
        records[key] = calls
        del learner
    torch.save(records, out / f"memory-rank{info.rank}.pt")


def run_errors(out: Path, info) -> None:
    """Factories that break the contract under ZeRO-3; rank 0 writes each error's type and message to
    DIR/errors.pt (every rank raises the same)."""
    algo, optim, lcfg, over, _ = CASES["z3_factory"]
    prebuilt = model()
    seeds = itertools.count(1)
    bad = {"prebuilt": lambda: prebuilt,  # built before the call: a full copy, not partitions
           "unseeded": lambda: model(seed=next(seeds))}  # a different init on each call
    errors = {}
    for key, fn in bad.items():
        try:
            make_learner(fn, algo, optim, lcfg, device="cpu", ds_overrides=over)
            errors[key] = None
        except (ValueError, TypeError) as e:
            errors[key] = (type(e).__name__, str(e))
    if info.is_main:
        torch.save(errors, out / "errors.pt")


BUCKET_MB = (0.25, 1.5)  # below most layer weights (many travel alone), and a few weights per bucket


def run_buckets(out: Path, info) -> None:
    """`iter_weight_buckets` under ZeRO-3 on MEMORY_MODEL (built partitioned from its factory): for each
    size in BUCKET_MB, every rank drains the stream and writes DIR/buckets-rank<r>.pt with the buckets
    (names, tensors, index, last) and, sampled at every ZeRO-3 gather and every bucket handed out,
    the most parameter bytes the rank held materialised at once, which parameters they were, and the
    most modules any materialised parameters at one time belonged to."""
    import deepspeed

    learner = make_learner(memory_model, AlgoConfig(), OptimConfig(), LearnerConfig(backend="deepspeed",
                           zero_stage=3), device="cpu", ds_overrides=PARTITION_ALL)
    models = [m for m in (learner.policy, learner.reference) if m is not None]
    named = {id(p): (k, p) for m in models for k, p in m.named_parameters()}
    peak: dict[str, Any] = {}

    def sample() -> None:
        held = [(k, p.data.numel() * p.data.element_size()) for k, p in named.values() if p.data.numel()]
        size = sum(n for _, n in held)
        peak["modules"] = max(peak["modules"], len({k.rsplit(".", 1)[0] for k, _ in held}))
        if size >= peak["bytes"]:
            peak.update(bytes=size, names=sorted(k for k, _ in held))

    gathered = deepspeed.zero.GatheredParameters
    enter = gathered.__enter__

    def enter_and_sample(ctx: Any) -> Any:
        got = enter(ctx)
        sample()
        return got

    results: dict[float, dict] = {}
    gathered.__enter__ = enter_and_sample
    try:
        for mb in BUCKET_MB:
            peak.update(bytes=0, names=[], modules=0)
            sample()  # before: nothing materialised
            before = peak["bytes"]
            buckets = []
            for b in learner.iter_weight_buckets(int(mb * (1 << 20))):
                sample()
                buckets.append({"names": b.names, "tensors": b.tensors, "index": b.index, "last": b.last,
                                "nbytes": b.nbytes})
            peak_after = dict(peak)
            peak.update(bytes=0, names=[], modules=0)
            sample()
            results[mb] = {"buckets": buckets, "before_bytes": before, "peak_bytes": peak_after["bytes"],
                           "peak_names": peak_after["names"],
                           "modules_at_once": peak_after["modules"], "after_bytes": peak["bytes"],
                           "meta": [(m.name, m.dtype, m.shape) for m in learner.weight_meta()],
                           "partition_numel": {k: p.ds_tensor.numel() for k, p in named.values()}}
    finally:
        gathered.__enter__ = enter
    torch.save(results, out / f"buckets-rank{info.rank}.pt")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with init_distributed("gloo", required=True, timeout_s=120) as info:
        names = args.cases.split(",")
        if any(FACTORY_CASES.get(n) == "hf" for n in names):
            if info.is_main:
                model().save_pretrained(args.out / "toy-hf")
            torch.distributed.barrier()
        for name in names:
            if name == "memory":
                run_memory(args.out, info)
            elif name == "errors":
                run_errors(args.out, info)
            elif name == "buckets":
                run_buckets(args.out, info)
            else:
                run_case(name, args.out, info, resume=args.resume)


if __name__ == "__main__":
    main()
    # Every output is written and the process group is gone: skip interpreter teardown, where a
    # DeepSpeed / gloo thread still joinable at exit aborts the process now and then ("terminate
    # called without an active exception", about 1 launch in 17 on 2 CPU ranks).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
