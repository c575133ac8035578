"""DeepSpeed learner throughput: tokens/s, MFU and peak memory of one `DeepSpeedLearner.update` under
ZeRO-2 and ZeRO-3, bf16, gradient checkpointing, for a Qwen2.5-1.5B-shaped model (random init, the
real config: hidden 1536, 28 layers, 12/2 heads, MLP 8960, vocabulary 151936, tied embeddings) on a
batch of 4 × 4096 tokens (one rollout group of 4 multi-turn episodes per rank).

The one command (issue #7's H200 check; each ZeRO stage runs in its own torchrun launch, so one
stage's leftovers never count in the next one's peak memory):

    .venv/bin/python scripts/bench_train_gpu.py --preset qwen2.5-1.5b --device cuda

    # = for each stage in --zero (default 2,3):
    #   torchrun --standalone --nproc_per_node 1 scripts/bench_train_gpu.py --worker --zero-stage S ...
    # then one table and bench_out/bench_train_gpu.json

On a GPU machine whose image lacks DeepSpeed: `bash scripts/gpu_check.sh prepare` where PyPI is
reachable, then `bash scripts/gpu_check.sh run` there with `.whl/` carried (this and bench_algo's overhead).

Known to run on CPU with a tiny shape (same code path, DeepSpeed over gloo, bf16 too):

    .venv/bin/python scripts/bench_train_gpu.py --preset tiny --device cpu --tokens 128 --repeats 1

Measured: the update (advantages, the policy forward + backward with chunked LM-head statistics, the
ZeRO gradient reduction, clip, AdamW step, LR schedule), median over --repeats after --warmup
updates, CUDA-synchronised. Variant `grpo` (default) is plain GRPO with one micro-batch: a single
training pass. Variant `aem_actfocus` adds AEM + ActFocus + KL: a reference model and no-grad passes.

FLOPs (model FLOPs, not hardware FLOPs: gradient checkpointing's recomputation is not counted, so
MFU shows its cost). N = parameters that do matmul work per token: every weight, the tied
embedding once as the LM head (the input lookup is free). L layers, d = heads × head_dim, s_i the
length of sequence i, T = Σ s_i real tokens (padding excluded), of which T_loss are trained; the LM
head (N_head = V·H of N) runs at those only (`swerl.learner.backend.sequence_stats`):
    training pass (forward + backward)  F_train  = 6·(N − N_head)·T + 6·N_head·T_loss + 6·L·d·Σ s_i²
    each no-grad pass (AEM / reference)  F_nograd = 2·(N − N_head)·T + 2·N_head·T_loss + 2·L·d·Σ s_i²
(causal attention: QKᵀ and A·V each cost 2·s²·d per layer over the full square, half of it under the
causal mask.) MFU = F_train / (update seconds × peak); `MFU incl. no-grad` adds the no-grad passes
actually run (counted by wrapping the learner's no-grad pass). Peak: --peak-tflops per GPU (H200
dense bf16: 989). tokens/s = world × T / update seconds. Peak memory: max over ranks of
torch.cuda.max_memory_allocated during the timed updates (CPU: the process's peak RSS).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

GB = 1024**3
PRESETS = {
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1024),
}
VARIANTS = ("grpo", "aem_actfocus")


def model_flops(n_params: int, layers: int, attn_dim: int, lengths: list[int], nograd_passes: int, *,
                head_params: int = 0, loss_tokens: int | None = None) -> tuple[float, float]:
    """(F_train, F_nograd total) of one update, per the module docstring; `head_params` of the
    `n_params` run at `loss_tokens` tokens only (default: all of them)."""
    tokens = sum(lengths)
    square = sum(s * s for s in lengths)
    head_tokens = tokens if loss_tokens is None else loss_tokens
    per_pass = (n_params - head_params) * tokens + head_params * head_tokens + layers * attn_dim * square
    return 6.0 * per_pass, nograd_passes * 2.0 * per_pass


def matmul_params(model) -> int:
    """Parameters with per-token matmul work: all (tied weights once), less an untied input embedding."""
    n = sum(p.numel() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.lm_head.weight
    return n if emb is head else n - emb.numel()


# ---- one stage, one torchrun launch ---------------------------------------------------------------


def build_model(args: argparse.Namespace, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(32768, args.tokens),
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config._attn_implementation = args.attn
    torch.manual_seed(args.seed)
    with torch.device(device):  # build in place: a 1.5B model is slow to init on CPU and then copy
        return Qwen2ForCausalLM(config)


def make_batch(args: argparse.Namespace, rank: int):
    """One group of `episodes` multi-turn episodes of exactly `tokens` tokens (see bench_train)."""
    from bench_train import make_episode

    from swerl.learner import collate

    rng = random.Random(args.seed + rank)
    trajs = [make_episode(rng, args.tokens, args.vocab, reward=float(i % 2)) for i in range(args.episodes)]
    return collate(trajs, [0] * args.episodes)


def worker(args: argparse.Namespace) -> None:
    from swerl.learner import (
        ActFocusConfig,
        AEMConfig,
        AlgoConfig,
        KLConfig,
        LearnerConfig,
        OptimConfig,
        make_learner,
    )
    from swerl.learner.dist import all_gather_object, init_distributed

    cuda = args.device == "cuda"
    with init_distributed("nccl" if cuda else "gloo", required=True) as info:
        device = info.device if cuda else "cpu"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        t0 = time.perf_counter()
        model = build_model(args, device)
        n_params = matmul_params(model)
        full = args.variant == "aem_actfocus"
        algo = AlgoConfig(aem=AEMConfig(enabled=full), actfocus=ActFocusConfig(enabled=full),
                          kl=KLConfig(coef=0.01 if full else 0.0), clip_high=0.28)
        optim = OptimConfig(lr=1e-7, micro_batch_tokens=args.micro_batch_tokens, chunk_size=args.chunk_size,
                            gradient_checkpointing=args.gradient_checkpointing)
        lcfg = LearnerConfig(backend="deepspeed", zero_stage=args.zero_stage, bf16=args.bf16)
        learner = make_learner(model, algo, optim, lcfg, device=device, total_steps=1000)
        batch = make_batch(args, info.rank)
        dev = dataclasses.replace(batch, input_ids=batch.input_ids.to(device),
                                  attention_mask=batch.attention_mask.to(device),
                                  loss_mask=batch.loss_mask.to(device))  # where the head runs
        with torch.no_grad():  # old log-probs from the initial policy: PPO ratios start near 1
            learner.policy.eval()
            logp = learner._stats(learner.policy, dev, compute_entropy=False).logp.float().cpu()
        old = torch.zeros_like(batch.old_logp)
        old[:, 1:] = logp * batch.loss_mask[:, 1:]
        batch = dataclasses.replace(batch, old_logp=old)
        setup_s = time.perf_counter() - t0

        passes = {"n": 0}
        no_grad_pass = learner._no_grad_pass

        def counted(*a, **k):
            passes["n"] += 1
            return no_grad_pass(*a, **k)

        learner._no_grad_pass = counted
        for _ in range(args.warmup):
            learner.update(batch)
        runs, peaks = [], []
        for _ in range(args.repeats):
            passes["n"] = 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t = time.perf_counter()
            m = learner.update(batch)
            sync()
            runs.append(time.perf_counter() - t)
            peaks.append(torch.cuda.max_memory_allocated() / GB if cuda
                         else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB)
        med = statistics.median(runs)
        lengths = batch.lengths.tolist()
        head = args.vocab * args.hidden  # the LM head (ZeRO-3 has partitioned the live weight by now)
        f_train, f_nograd = model_flops(n_params, args.layers, args.hidden, lengths, passes["n"],
                                        head_params=head, loss_tokens=int(batch.loss_mask.sum()))
        peak_all = max(all_gather_object(max(peaks)))
        row = {
            "zero_stage": args.zero_stage, "variant": args.variant, "world_size": info.world_size,
            "update_s": med, "runs_s": runs, "tokens_per_rank": sum(lengths),
            "tokens_per_s": info.world_size * sum(lengths) / med,
            "tflops_per_gpu": f_train / med / 1e12,
            "mfu": f_train / med / (args.peak_tflops * 1e12) if args.peak_tflops else None,
            "mfu_incl_nograd": (f_train + f_nograd) / med / (args.peak_tflops * 1e12)
            if args.peak_tflops else None,
            "nograd_passes": passes["n"], "flops_train": f_train, "flops_nograd": f_nograd,
            "peak_mem_gb": peak_all, "peak_mem_kind": "cuda max_memory_allocated" if cuda else "cpu peak RSS",
            "n_params": n_params, "setup_s": setup_s, "loss": m.loss, "grad_norm": m.grad_norm,
            "micro_batches": m.micro_batches,
        }
        if info.is_main:
            args.result.parent.mkdir(parents=True, exist_ok=True)
            args.result.write_text(json.dumps(row, indent=2))


# ---- the driver: one launch per stage, then the table -----------------------------------------------


def launch(args: argparse.Namespace, stage: int, result: Path) -> dict:
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(args.nproc), __file__, "--worker",
           "--zero-stage", str(stage), "--result", str(result)]
    for k in ("preset", "device", "episodes", "tokens", "warmup", "repeats", "variant", "micro_batch_tokens",
              "chunk_size", "peak_tflops", "seed", "attn", "hidden", "layers", "heads", "kv_heads",
              "intermediate", "vocab"):
        v = getattr(args, k)
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    cmd += ["--bf16" if args.bf16 else "--no-bf16"]
    cmd += ["--gradient-checkpointing" if args.gradient_checkpointing else "--no-gradient-checkpointing"]
    print(f"ZeRO-{stage}: {' '.join(cmd)}", flush=True)
    t = time.perf_counter()
    r = subprocess.run(cmd, timeout=args.timeout, capture_output=True, text=True)
    if r.returncode != 0 or not result.is_file():
        tail = (r.stdout + r.stderr)[-4000:]
        print(f"ZeRO-{stage} failed (exit {r.returncode}) after {time.perf_counter() - t:.0f} s:\n{tail}",
              flush=True)
        return {"zero_stage": stage, "error": tail[-1500:]}
    return json.loads(result.read_text())


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "n/a"


def print_table(rows: list[dict], meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    table = Table(title=f"DeepSpeedLearner.update: {meta['model']}, {meta['episodes']}x{meta['tokens']} "
                        f"tokens per rank, {meta['precision']}, {meta['machine']}")
    for h in ("ZeRO", "variant", "update s", "tokens/s", "TFLOP/s/GPU", "MFU", "MFU incl. no-grad",
              "no-grad passes", "peak mem GB"):
        table.add_column(h, justify="right", no_wrap=True)
    for r in rows:
        if "error" in r:
            table.add_row(str(r["zero_stage"]), meta["variant"], "failed", "", "", "", "", "", "")
            continue
        table.add_row(str(r["zero_stage"]), r["variant"], f"{r['update_s']:.3f}", f"{r['tokens_per_s']:,.0f}",
                      f"{r['tflops_per_gpu']:.1f}", _pct(r["mfu"]), _pct(r["mfu_incl_nograd"]),
                      str(r["nograd_passes"]), f"{r['peak_mem_gb']:.2f}")
    console.print(table)
    console.print("MFU = (6·(N − N_head)·T + 6·N_head·T_loss + 6·L·d·Σs²) / (update s × peak); "
                  "no-grad passes add a third of that each. "
                  f"N = {rows[0].get('n_params', 0) / 1e6:.1f}M; peak {meta['peak_tflops']} TFLOP/s per GPU.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="qwen2.5-1.5b")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--zero", default="2,3", help="comma-separated ZeRO stages, one launch each")
    ap.add_argument("--nproc", type=int, default=1,
                    help="GPUs (ranks) per launch; each rank gets its own batch")
    ap.add_argument("--episodes", type=int, default=4, help="episodes per rank (one rollout group)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per episode")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", choices=VARIANTS, default="grpo")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384, help="the learner's micro-batch budget")
    ap.add_argument("--chunk-size", type=int, default=4096, help="LM-head statistics chunk (tokens)")
    ap.add_argument("--attn", default="sdpa",
                    help="transformers attention implementation (sdpa, flash_attention_2, eager)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak dense bf16 TFLOP/s per GPU (default: 989, "
                    "H200, on cuda; none on cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per stage launch")
    ap.add_argument("--out", type=Path, default=Path("bench_out/bench_train_gpu.json"))
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=None, help="override the preset")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--zero-stage", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.peak_tflops is None and args.device == "cuda":
        args.peak_tflops = 989.0
    if args.worker:
        worker(args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device (use --device cpu for the CPU check)")
    stages = [int(s) for s in args.zero.split(",") if s.strip()]
    if bad := [s for s in stages if s not in (0, 1, 2, 3)]:
        ap.error(f"--zero: ZeRO stages are 0-3, got {bad}")
    meta = {
        **{k: (str(v) if isinstance(v, Path) else v)
           for k, v in vars(args).items() if k not in ("worker", "result")},
        "model": f"{args.preset} (h{args.hidden} L{args.layers} heads {args.heads}/{args.kv_heads} "
                 f"ffn {args.intermediate} V{args.vocab})",
        "precision": (("bf16" if args.bf16 else "fp32")
                      + (" + grad ckpt" if args.gradient_checkpointing else "")),
        "torch": torch.__version__,
        "machine": torch.cuda.get_device_name() if args.device == "cuda"
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
    }
    rows = [launch(args, s, args.out.parent / f".bench_train_gpu_zero{s}.json") for s in stages]
    print_table(rows, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
