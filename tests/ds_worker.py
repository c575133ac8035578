"""One rank of the DeepSpeed learner tests (launched by tests/test_learner_deepspeed.py).

    .venv/bin/torchrun --nproc_per_node 2 tests/ds_worker.py --out DIR [--cases z0,z2] [--resume]
    .venv/bin/python tests/ds_worker.py --out DIR --cases z2          # world 1 (no launcher)

For each case: a DeepSpeedLearner over the ranks (toy Qwen2, fp32, gloo) takes one update on this rank's
whole rollout groups of a fixed batch; rank 0 writes the update's metrics and the policy's full
weights to DIR/<case>.pt. Checkpoint cases then save a checkpoint under DIR/run-<case>, take a second
update and write DIR/<case>-next.pt; with --resume a fresh learner loads that checkpoint and takes
the same second update, written to DIR/<case>-resumed.pt. The test compares all of it with the
single-process `Learner` on the full batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    "z3": (AlgoConfig(**FULL), OptimConfig(lr=1e-2, micro_batch_tokens=30, ppo_epochs=2, gradient_checkpointing=True),
           LearnerConfig(backend="deepspeed", zero_stage=3), PARTITION_ALL, True),
    # LoRA on ZeRO-3: the reference is the policy engine with adapters disabled
    "z3_lora": (AlgoConfig(kl=KLConfig(coef=0.5)), OptimConfig(lr=5e-2, micro_batch_tokens=40),
                LearnerConfig(backend="deepspeed", zero_stage=3, lora=LoRAConfig(enabled=True, r=4, alpha=8.0)),
                PARTITION_ALL, False),
    # bf16 weights and activations (fp32 master weights), the z3 algorithm
    "z3_bf16": (AlgoConfig(**FULL), OptimConfig(lr=1e-2, micro_batch_tokens=30),
                LearnerConfig(backend="deepspeed", zero_stage=3, bf16=True), PARTITION_ALL, False),
}
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


def build(name: str):
    algo, optim, lcfg, over, _ = CASES[name]
    if lcfg.lora.enabled:  # make_learner would wrap a fresh model; start from the prepared adapters instead
        from swerl.learner.ds_learner import DeepSpeedLearner

        return DeepSpeedLearner(lora_model(lcfg.lora), algo, optim, lcfg, device="cpu", total_steps=TOTAL_STEPS,
                                ds_overrides=over)
    return make_learner(model(), algo, optim, lcfg, device="cpu", total_steps=TOTAL_STEPS, ds_overrides=over)


def run_case(name: str, out: Path, info, *, resume: bool) -> None:
    ckpt = CASES[name][4]
    b1, b2 = batches()
    learner = build(name)
    run_dir = out / f"run-{name}"
    if resume:
        from swerl.learner.checkpoint import latest_checkpoint

        extra = learner.load_checkpoint(latest_checkpoint(run_dir))
        m = learner.update(local(b2, info.rank, info.world_size))
        dump(out / f"{name}-resumed.pt", learner, m, info, extra=extra)
        return
    m = learner.update(local(b1, info.rank, info.world_size))
    dump(out / f"{name}.pt", learner, m, info)
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
        for name in args.cases.split(","):
            run_case(name, args.out, info, resume=args.resume)


if __name__ == "__main__":
    main()
