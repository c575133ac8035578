"""Learner throughput: tokens/s of one `Learner.update`, and what AEM + ActFocus cost over plain GRPO.

A random-init Qwen2 (vocabulary 151936 like real Qwen by default, so the LM head costs what it
really costs) trains on a fixed synthetic batch of multi-turn episodes: a prompt, then turns of
reasoning (span 1), an action (span 2) and an observation (span 0, out of the loss), with turn
indices, rollout groups of 4 and mixed rewards. The old log-probs are the initial model's own, so
the PPO ratios start near 1 as in the real loop.

Variants, all on the same batch and the same model (one Learner per variant, each with its own AdamW
state, sharing one frozen reference; the learning rate is tiny so the weights barely move):
    grpo          plain GRPO: one policy forward + backward per micro-batch
    aem           + AEM: a no-grad policy pre-pass for the per-turn entropies
    actfocus      + ActFocus: a no-grad reference pass for the energy
    aem_actfocus  both (the reference pass also gives the KL's log-probs; see --kl-coef)
    grpo_head_all, aem_actfocus_head_all
                  the baselines of the LM head on every token (prompt, observations and padding too),
                  as the learner ran it before it computed the head at the loss tokens only
Each repeat runs every variant once, in a rotated order, so drift hits all alike; medians are
reported. Times include everything `update` does (advantages, passes, loss, backward, clipping,
AdamW step). On CPU read the ratios, not the absolute numbers.

MFU = 6·((N − N_head)·tokens + N_head·trained tokens)/s / peak FLOP/s (--peak-tflops; N counts the
LM head once, not the embedding lookup; attention's own FLOPs are not counted): the useful work of
the update's training pass, the head at the trained tokens only, so extra no-grad passes (AEM,
reference) and the `*_head_all` baselines' head on every token lower it, as they should.

Usage:
    python scripts/bench_train.py                              # CPU defaults, ~3 minutes on 2 cores
    python scripts/bench_train.py --model smollm2-135m-instruct --episodes 4 --tokens 768 --obs-max 256 \
        --repeats 2 --micro-batch-tokens 3072 --out bench_out/bench_train_smollm2.json    # ~6 minutes
    python scripts/bench_train.py --vocab 4096 --hidden 256    # LM head out of the picture
    python scripts/bench_train.py --device cuda --preset qwen2.5-1.5b --episodes 4 --tokens 4096 \\
        --autocast --peak-tflops 989 [--gradient-checkpointing]    # the issue's H200 check
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swerl.learner import (
    ActFocusConfig,
    AEMConfig,
    AlgoConfig,
    KLConfig,
    Learner,
    OptimConfig,
    collate,
    sequence_stats,
    torch_backend,
)
from swerl.structs import Trajectory

GB = 1024**3
VARIANTS = ("grpo", "aem", "actfocus", "aem_actfocus", "grpo_head_all", "aem_actfocus_head_all")
PRESETS = {
    # Qwen2.5-1.5B's shape (tied embeddings, like the real one)
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936),
}


# --- model and batch ---------------------------------------------------------------------------


def make_model(args: argparse.Namespace, device: torch.device):
    if args.model_dir:  # a real checkpoint (its architecture, vocabulary and weights)
        from swerl.models import load_model

        model = load_model(args.model_dir, dtype=getattr(torch, args.dtype), device=device)
    else:
        model = random_qwen2(args, device)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def random_qwen2(args: argparse.Namespace, device: torch.device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(32768, args.tokens),
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(args.seed)
    with device:  # build in place: a 1.5B model is slow to init on CPU and then copy
        model = Qwen2ForCausalLM(config)
    return model.to(getattr(torch, args.dtype))


def param_count(model) -> int:
    """Parameters that do matmul work per token: all of them (tied weights once), less an untied
    input embedding (a lookup)."""
    n = sum(p.numel() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.lm_head.weight
    return n if emb is head else n - emb.numel()


def make_episode(rng: random.Random, length: int, vocab: int, reward: float, obs_max: int = 64) -> Trajectory:
    """One multi-turn episode of exactly `length` tokens: prompt, then (reasoning, action,
    observation) turns, the last one cut where the length runs out; an observation has
    obs_max / 4 to obs_max tokens."""
    prompt = min(64, max(2, length // 8))
    ids = [rng.randrange(1, vocab) for _ in range(length)]
    mask, span, turn = [0] * prompt, [0] * prompt, [-1] * prompt
    t = 0
    while len(mask) < length:
        r, a, o = rng.randint(24, 96), rng.randint(8, 32), rng.randint(obs_max // 4, obs_max)
        mask += [1] * (r + a) + [0] * o
        span += [1] * r + [2] * a + [0] * o
        turn += [t] * (r + a) + [-1] * o
        t += 1
    mask, span, turn = mask[:length], span[:length], turn[:length]
    return Trajectory(
        token_ids=tuple(ids),
        loss_mask=tuple(mask),
        span=tuple(span),
        logprobs=(0.0,) * length,
        turn_index=tuple(turn),
        prompt_len=prompt,
        terminated=True,
        truncated=False,
        stop_reason="submit",
        reward=reward,
        num_turns=t,
        num_tool_calls=t,
    )


def make_batch(args: argparse.Namespace, model, device: torch.device, autocast):
    """The synthetic batch; old log-probs from the initial model (so PPO ratios start near 1)."""
    rng = random.Random(args.seed)
    group_size = min(4, args.episodes)
    trajs, groups = [], []
    for i in range(args.episodes):
        length = round(args.tokens * (1 - args.jitter * rng.random()))
        in_group = i % group_size
        reward = 1.0 if in_group == 0 else 0.0 if in_group == 1 else float(rng.random() < 0.5)
        trajs.append(make_episode(rng, length, args.vocab, reward, args.obs_max))
        groups.append(i // group_size)
    batch = collate(trajs, groups)
    with torch.no_grad(), autocast():
        model.eval()
        dev = dataclasses.replace(
            batch, input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)
        )
        logp = sequence_stats(model, dev, chunk_size=args.chunk_size, compute_entropy=False).logp
    old = torch.zeros_like(batch.old_logp)
    old[:, 1:] = logp.float().cpu() * batch.loss_mask[:, 1:]
    return dataclasses.replace(batch, old_logp=old)


@contextlib.contextmanager
def lm_head_on_every_token(on: bool) -> Iterator[None]:
    """The baseline: the plain-torch learner's forwards run the LM head on every token."""
    real = torch_backend.loss_positions
    if on:
        torch_backend.loss_positions = lambda _batch: None  # sequence_stats(where=None): all tokens
    try:
        yield
    finally:
        torch_backend.loss_positions = real


def variant_config(name: str, args: argparse.Namespace) -> AlgoConfig:
    aem = "aem" in name
    actfocus = "actfocus" in name
    return AlgoConfig(
        aem=AEMConfig(enabled=aem),
        actfocus=ActFocusConfig(enabled=actfocus),
        kl=KLConfig(coef=args.kl_coef if actfocus else 0.0),
        clip_high=0.28,
    )


# --- measurement -------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast)

    t0 = time.perf_counter()
    model = make_model(args, device)
    n_params = param_count(model)
    batch = make_batch(args, model, device, autocast)
    configs = {v: variant_config(v, args) for v in args.variants}
    optim = OptimConfig(lr=args.lr, micro_batch_tokens=args.micro_batch_tokens, chunk_size=args.chunk_size)
    # one Learner per variant over the same model (each its own AdamW state), sharing one frozen reference
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    learners = {v: Learner(model, c, optim, device=args.device,
                           reference=reference if c.needs_reference else None) for v, c in configs.items()}
    setup_s = time.perf_counter() - t0
    tokens = int(batch.lengths.sum())
    trained = int(batch.loss_mask.sum())
    print(
        f"setup {setup_s:.1f} s: N={n_params / 1e6:.1f}M params, batch "
        f"{batch.size}x{batch.input_ids.shape[1]} ({tokens} tokens, {trained} in the loss)",
        flush=True,
    )

    def update(variant: str) -> dict:
        learner = learners[variant]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t = time.perf_counter()
        with autocast(), lm_head_on_every_token(variant.endswith("_head_all")):
            m = learner.update(batch)
        sync()
        dt = time.perf_counter() - t
        assert not m.skipped, "the synthetic batch should never be skipped"
        return {
            "s": dt,
            "peak_gb": torch.cuda.max_memory_allocated() / GB if cuda else None,
            "micro_batches": m.micro_batches,
            "loss": m.loss,
            "grad_norm": m.grad_norm,
            "aem_alpha_min": m.aem_alpha_min,
            "aem_alpha_max": m.aem_alpha_max,
            "actfocus_weight_action": m.actfocus_weight_action,
        }

    order = list(args.variants)
    for _ in range(args.warmup):  # kernels, allocator, each learner's AdamW state
        for v in order:
            w = update(v)
            print(f"  warm-up {v}: {w['s']:.2f} s", flush=True)
    runs: dict[str, list[dict]] = {v: [] for v in order}
    for i in range(args.repeats):
        k = i % len(order)
        for v in order[k:] + order[:k]:
            r = update(v)
            runs[v].append(r)
            print(f"  repeat {i + 1}/{args.repeats} {v:>12s}: {r['s']:.3f} s", flush=True)

    head = model.lm_head.weight.numel()
    useful_flops = 6.0 * ((n_params - head) * tokens + head * trained)
    base = statistics.median(r["s"] for r in runs[order[0]])
    rows = []
    for v in order:
        med = statistics.median(r["s"] for r in runs[v])
        tps = tokens / med
        row = {
            "variant": v,
            "update_s": med,
            "tokens_per_s": tps,
            "trained_tokens_per_s": trained / med,
            "time_ratio_vs_" + order[0]: med / base,
            "overhead_vs_" + order[0]: med / base - 1.0,
            "mfu": useful_flops / med / (args.peak_tflops * 1e12) if args.peak_tflops else None,
            "peak_gb": max(r["peak_gb"] for r in runs[v]) if cuda else None,
            "micro_batches": runs[v][0]["micro_batches"],
            "aem_alpha_range": [runs[v][-1]["aem_alpha_min"], runs[v][-1]["aem_alpha_max"]],
            "actfocus_weight_action": runs[v][-1]["actfocus_weight_action"],
            "runs_s": [r["s"] for r in runs[v]],
        }
        rows.append(row)
    return {
        "rows": rows,
        "n_params": n_params,
        "tokens": tokens,
        "trained_tokens": trained,
        "padded_shape": list(batch.input_ids.shape),
        "setup_s": setup_s,
    }


# --- output ------------------------------------------------------------------------------------


def print_table(res: dict, meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    base = meta["variants"][0]
    console = Console(width=None if sys.stdout.isatty() else 140)
    title = (
        f"Learner.update: {meta['model']}, N={res['n_params'] / 1e6:.1f}M, batch "
        f"{meta['episodes']}x~{meta['tokens']} ({res['tokens']} tokens), {meta['device']}, "
        f"{meta['precision']}"
    )
    table = Table(title=title)
    cuda = meta["device"] == "cuda"
    head = ["variant", "median s", "tokens/s", f"time / {base}", "overhead"]
    if meta["peak_tflops"]:
        head.append("MFU")
    if cuda:
        head.append("peak GB")
    for h in head:
        table.add_column(h, justify="left" if h == "variant" else "right", no_wrap=True)
    for r in res["rows"]:
        cells = [
            r["variant"],
            f"{r['update_s']:.3f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['time_ratio_vs_' + base]:.3f}",
            f"{100 * r['overhead_vs_' + base]:+.1f}%",
        ]
        if meta["peak_tflops"]:
            cells.append(f"{100 * r['mfu']:.1f}%")
        if cuda:
            cells.append(f"{r['peak_gb']:.1f}")
        table.add_row(*cells)
    console.print(table)
    console.print(meta["note"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="a real model's shape; overrides --hidden/--layers/--heads/--kv-heads/--intermediate/--vocab",
    )
    ap.add_argument("--model", default="",
                    help="a checkpoint directory or an imported name (smollm2-135m-instruct) instead of a "
                         "random-init Qwen2 of the shape below")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary (Qwen2.5: 151936)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256, help="tokens of the longest episode")
    ap.add_argument("--obs-max", type=int, default=64,
                    help="most tokens of one observation (tool output); an agent's are often thousands")
    ap.add_argument(
        "--jitter", type=float, default=0.1, help="episode lengths are tokens x (1 - jitter x U[0,1))"
    )
    ap.add_argument(
        "--repeats", type=int, default=None, help="timed updates per variant (default 3 CPU, 5 CUDA)"
    )
    ap.add_argument("--warmup", type=int, default=1, help="untimed updates of every variant first")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, the first is the baseline (from {', '.join(VARIANTS)})",
    )
    ap.add_argument("--kl-coef", type=float, default=0.0, help="KL coefficient of the ActFocus variants")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="model weights")
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast around the update")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument(
        "--chunk-size", type=int, default=None, help="LM-head chunk (default 1024 CPU, 4096 CUDA)"
    )
    ap.add_argument("--lr", type=float, default=1e-7)
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="peak FLOP/s of the device for MFU (H200 dense bf16: 989)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_out/bench_train.json"))
    args = ap.parse_args()

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.preset:
        for k, v in PRESETS[args.preset].items():
            setattr(args, k, v)
    args.intermediate = args.intermediate or 4 * args.hidden
    args.repeats = args.repeats or (5 if cuda else 3)
    args.chunk_size = args.chunk_size or (4096 if cuda else 1024)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if bad := [v for v in args.variants if v not in VARIANTS]:
        ap.error(f"unknown variants {bad}; choose from {VARIANTS}")

    args.model_dir = ""
    if args.model:  # resolved (and a shipped model imported) once, here
        from swerl.models import load_model_config
        from swerl.models.shipped import resolve_model

        try:
            args.model_dir = resolve_model(args.model)
            args.vocab = load_model_config(args.model_dir).vocab_size  # the batch's token ids
        except (OSError, ValueError) as e:
            ap.error(f"--model {args.model}: {e}")
    model_desc = args.model or args.preset or (
        f"Qwen2 h{args.hidden} L{args.layers} heads {args.heads}/{args.kv_heads} "
        f"ffn {args.intermediate} V{args.vocab}"
    )
    meta = {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": model_desc,
        "precision": args.dtype
        + (" + bf16 autocast" if args.autocast else "")
        + (" + grad ckpt" if args.gradient_checkpointing else ""),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": torch.cuda.get_device_name()
        if cuda
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads",
        "note": "One model, a Learner per variant; a variant's update = advantages (+ AEM's no-grad policy "
        "pre-pass) (+ the no-grad reference pass) + policy forward/backward per micro-batch + clip + AdamW "
        "step. "
        "tokens/s counts all real tokens (prompt and observations too). Overhead = median time / the "
        "first variant's - 1. MFU = 6 ((N - N_head) tokens + N_head trained tokens)/s / peak (training "
        "pass only). *_head_all: the LM head on every token (the learner before it ran at trained ones).",
    }
    print(
        f"bench_train: {meta['machine']}, torch {torch.__version__}, {model_desc}, {meta['precision']}",
        flush=True,
    )
    res = bench(args)
    if not cuda:
        res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
    print_table(res, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, **res}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
