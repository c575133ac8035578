"""Benchmarks of swerl.algo: chunked token statistics vs full logits, and the cost of AEM + ActFocus.

1. token_statistics (chunked, custom autograd) vs the naive computation (full fp32 logits,
   log_softmax, entropy, logsumexp) at one sequence of T tokens: peak extra memory and time, for
   a reference-style forward (no grad) and a training step (forward + backward of logp.sum(),
   entropy computed without gradient). Targets: memory ratio <= 0.15, time ratio <= 1.2.
   CPU peak memory is ru_maxrss of a fresh spawned process per measurement, minus its RSS once the
   inputs exist; CUDA uses torch.cuda.max_memory_allocated.
2. One loss step with AEM + ActFocus vs plain GRPO on the same inputs (target overhead <= 2%).
   Both run the policy pass (forward + backward) and a no-grad reference pass (the KL's ref logp).
   The energy ActFocus needs comes free with that reference pass; the overhead measured is the
   policy pass's entropy (AEM's input) plus AEM and ActFocus themselves.

Usage:
    python scripts/bench_algo.py                                  # CPU defaults, a few minutes on 2 cores
    python scripts/bench_algo.py --device cuda --T 32768          # bf16 inputs by default on CUDA
"""

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swerl.algo import (
    actfocus_weights,
    aem_advantages,
    aggregate_loss,
    group_advantages,
    kl_penalty,
    policy_loss,
    token_statistics,
)

GB = 1024**3
MEMORY_TARGET = 0.15  # issue 3: chunked peak memory <= 0.15 of the naive version


# --- inputs ------------------------------------------------------------------------------------


def _randn(shape, dtype, device, scale, seed):
    """Random tensor filled 4096 rows at a time: no full-size fp32 temporary inflates the CPU peak."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = torch.empty(shape, dtype=dtype, device=device)
    flat = out.view(-1, shape[-1])
    for i in range(0, flat.shape[0], 4096):
        rows = flat[i : i + 4096]
        rows.copy_(torch.randn(rows.shape, generator=gen, device=device).mul_(scale))
    return out


def make_inputs(n_tok, hidden_size, vocab, dtype, device, seed=0):
    hidden = _randn((n_tok, hidden_size), dtype, device, 1.0, seed)
    # logits of std ~3, like a trained LM head (and no denormal-heavy exp)
    weight = _randn((vocab, hidden_size), dtype, device, 3.0 / hidden_size**0.5, seed + 1)
    gen = torch.Generator(device=device).manual_seed(seed + 2)
    targets = torch.randint(0, vocab, (n_tok,), generator=gen, device=device)
    return hidden, weight, targets


# --- the two implementations -------------------------------------------------------------------


def naive_stats(hidden, weight, targets):
    logits = hidden.float() @ weight.float().T  # (N, V) fp32
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        energy = -torch.logsumexp(logits, dim=-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, energy


def naive_bf16_stats(hidden, weight, targets):
    """The usual training-code baseline: logits from a low-precision matmul, then .float()."""
    logits = (hidden @ weight.T).float()  # (N, V), rounded to the input dtype first
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        energy = -torch.logsumexp(logits, dim=-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, energy


def chunked_stats(hidden, weight, targets, chunk):
    return tuple(token_statistics(hidden, weight, targets, chunk_size=chunk))


def run_variant(variant, mode, hidden, weight, targets, sync):
    """One measured call; returns {"fwd_s", "bwd_s"}."""
    fn = {"naive": naive_stats, "naive_lowp": naive_bf16_stats}.get(variant) or (
        lambda h, w, t: chunked_stats(h, w, t, int(variant))
    )
    if mode == "forward":
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn(hidden, weight, targets)
        sync()
        del out
        return {"fwd_s": time.perf_counter() - t0, "bwd_s": 0.0}
    hidden.grad = weight.grad = None
    t0 = time.perf_counter()
    logp, _, _ = fn(hidden, weight, targets)
    loss = logp.sum()
    sync()
    t1 = time.perf_counter()
    loss.backward()
    sync()
    t2 = time.perf_counter()
    return {"fwd_s": t1 - t0, "bwd_s": t2 - t1}


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_child(args, variant, mode, queue):
    """Runs in a fresh spawned process so ru_maxrss sees this measurement alone."""
    torch.set_num_threads(args["threads"])
    dtype = getattr(torch, args["dtype"])
    # load kernels and thread pools on tiny inputs first, so they are not counted
    small = make_inputs(8, 16, 64, dtype, "cpu")
    for t in small[:2]:
        t.requires_grad_(mode == "train")
    run_variant(variant if variant == "naive" else "4", mode, *small, sync=lambda: None)
    hidden, weight, targets = make_inputs(args["T"], args["H"], args["V"], dtype, "cpu")
    hidden.requires_grad_(mode == "train")
    weight.requires_grad_(mode == "train")
    base = _rss_bytes()
    times = [run_variant(variant, mode, hidden, weight, targets, sync=lambda: None)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base  # ru_maxrss is in KiB
    for _ in range(args["repeats"] - 1):
        times.append(run_variant(variant, mode, hidden, weight, targets, sync=lambda: None))
    queue.put({"peak_bytes": peak, "times": times})


def measure_cpu(args, variant, mode):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=cpu_child, args=(args, variant, mode, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def measure_cuda(args, variant, mode, inputs):
    hidden, weight, targets = inputs
    hidden.requires_grad_(mode == "train")
    weight.requires_grad_(mode == "train")
    sync = torch.cuda.synchronize
    run_variant(variant, mode, hidden, weight, targets, sync)  # warm-up: kernels, allocator
    hidden.grad = weight.grad = None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = [run_variant(variant, mode, hidden, weight, targets, sync)]
    peak = torch.cuda.max_memory_allocated() - base
    for _ in range(args["repeats"] - 1):
        times.append(run_variant(variant, mode, hidden, weight, targets, sync))
    hidden.grad = weight.grad = None
    return {"peak_bytes": peak, "times": times}


def bench_token_stats(args, chunks):
    variants = ["naive", *map(str, chunks)]
    if args["device"] == "cuda" and args["dtype"] != "float32":
        variants.insert(1, "naive_lowp")  # for reference: low-precision logits, then fp32
    inputs = None
    if args["device"] == "cuda":
        inputs = make_inputs(args["T"], args["H"], args["V"], getattr(torch, args["dtype"]), "cuda")
    rows = {}
    for mode in ("forward", "train"):
        for variant in variants:
            res = (
                measure_cpu(args, variant, mode)
                if inputs is None
                else measure_cuda(args, variant, mode, inputs)
            )
            fwd = statistics.median(t["fwd_s"] for t in res["times"])
            bwd = statistics.median(t["bwd_s"] for t in res["times"])
            rows[(variant, mode)] = {
                "peak_gb": res["peak_bytes"] / GB,
                "fwd_s": fwd,
                "bwd_s": bwd,
                "total_s": fwd + bwd,
            }
            print(
                f"  {mode:7s} {variant:>10s}: peak {res['peak_bytes'] / GB:7.3f} GB, {fwd + bwd:8.3f} s",
                flush=True,
            )
    # Fastest training time among the chunk sizes that meet the memory target; fastest overall if none does.
    naive_peak = rows[("naive", "train")]["peak_gb"]
    fits = [c for c in chunks if rows[(str(c), "train")]["peak_gb"] <= MEMORY_TARGET * naive_peak] or chunks
    best = min(fits, key=lambda c: rows[(str(c), "train")]["total_s"])
    results = []
    for (variant, mode), row in rows.items():
        naive = rows[("naive", mode)]
        extra = {}
        if ("naive_lowp", mode) in rows:
            extra["time_ratio_vs_naive_lowp"] = row["total_s"] / rows[("naive_lowp", mode)]["total_s"]
        results.append(
            {
                "variant": variant if variant.startswith("naive") else f"chunked-{variant}",
                "mode": mode,
                **row,
                "memory_ratio": row["peak_gb"] / naive["peak_gb"],
                "time_ratio": row["total_s"] / naive["total_s"],
                **extra,
            }
        )
    return results, best


# --- loss-step overhead ------------------------------------------------------------------------


def episode_layout(batch, length, device):
    """Multi-turn rows: per 128-token turn, 32 observation (span 0), 80 reasoning (1), 16 action (2)."""
    pos = torch.arange(length, device=device)
    in_turn = pos % 128
    span = torch.where(in_turn < 32, 0, torch.where(in_turn < 112, 1, 2)).expand(batch, length)
    turn = (pos // 128).expand(batch, length)
    mask = span > 0
    return span, torch.where(mask, turn, -1), mask


def bench_overhead(args, chunk):
    device, dtype = args["device"], getattr(torch, args["dtype"])
    batch, length = args["overhead_B"], args["overhead_T"]
    n_tok, vocab = batch * length, args["overhead_V"]
    hidden, weight, targets = make_inputs(n_tok, args["H"], vocab, dtype, device, seed=10)
    ref_hidden, ref_weight, _ = make_inputs(n_tok, args["H"], vocab, dtype, device, seed=20)
    hidden, weight = hidden.requires_grad_(), weight.requires_grad_()
    targets = targets.view(batch, length)
    hidden_3d, ref_hidden_3d = hidden.view(batch, length, -1), ref_hidden.view(batch, length, -1)
    span, turn, mask = episode_layout(batch, length, device)
    gen = torch.Generator(device=device).manual_seed(30)
    rewards = torch.randint(0, 2, (batch,), generator=gen, device=device).float()
    groups = torch.arange(batch, device=device) // 4  # rollout groups of 4
    with torch.no_grad():
        old_logp = token_statistics(hidden_3d, weight, targets, chunk_size=chunk, compute_entropy=False).logp
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    algo_time = [0.0]

    def step(variant):
        hidden.grad = weight.grad = None
        t0 = time.perf_counter()
        adv = group_advantages(rewards, groups, "grpo")
        with torch.no_grad():
            ref = token_statistics(
                ref_hidden_3d, ref_weight, targets, chunk_size=chunk, compute_entropy=False
            )
        pol = token_statistics(
            hidden_3d, weight, targets, chunk_size=chunk, compute_entropy=variant != "grpo_no_entropy"
        )
        weights = None
        if variant == "aem_actfocus":
            sync()
            ta = time.perf_counter()
            adv, _ = aem_advantages(adv, groups, pol.entropy, turn, mask, lam=1.0)
            weights = actfocus_weights(ref.energy, span, mask, alpha=0.3, beta=0.5)
            sync()
            algo_time[0] = time.perf_counter() - ta
        loss, _ = policy_loss(pol.logp, old_logp, adv, mask, weights=weights, clip_high=0.28)
        loss = loss + 0.001 * aggregate_loss(kl_penalty(pol.logp, ref.logp, "k3"), mask)
        loss.backward()
        sync()
        return time.perf_counter() - t0

    variants = ["grpo_no_entropy", "grpo", "aem_actfocus"]
    step("aem_actfocus")  # warm-up
    times = {v: [] for v in variants}
    algo = []
    for i in range(args["overhead_repeats"]):
        # rotate the order so drift (thermal, other load) hits every variant alike
        for v in variants[i % 3 :] + variants[: i % 3]:
            times[v].append(step(v))
            if v == "aem_actfocus":
                algo.append(algo_time[0])
    med = {v: statistics.median(t) for v, t in times.items()}
    algo_s = statistics.median(algo)
    return {
        "shape": f"{batch}x{length}",
        "H": args["H"],
        "V": vocab,
        "dtype": args["dtype"],
        "chunk_size": chunk,
        "repeats": args["overhead_repeats"],
        "grpo_step_s": med["grpo"],
        "grpo_no_entropy_step_s": med["grpo_no_entropy"],
        "aem_actfocus_step_s": med["aem_actfocus"],
        "overhead_ratio": med["aem_actfocus"] / med["grpo"] - 1.0,
        "overhead_ratio_vs_no_entropy": med["aem_actfocus"] / med["grpo_no_entropy"] - 1.0,
        "aem_actfocus_math_s": algo_s,
        "aem_actfocus_math_ratio": algo_s / med["grpo"],
        "steps_s": times,
        "note": "every step: advantages, policy token_statistics (fwd+bwd), no-grad reference "
        "token_statistics (ref logp for a k3 KL; its energy comes free), policy_loss. 'grpo' computes the "
        "policy entropy like token_statistics' default (and verl's entropy metric); 'grpo_no_entropy' skips "
        "it, so the overhead vs it also counts the entropy AEM needs. The math alone is AEM (response "
        "entropy, alpha, token advantages) + ActFocus weights.",
    }


# --- output ------------------------------------------------------------------------------------


def print_tables(token_rows, best, overhead, meta):
    title = (f"token_statistics vs naive  (T={meta['T']}, H={meta['H']}, V={meta['V']}, {meta['dtype']}, "
             f"{meta['device']})")
    head = ["variant", "mode", "peak GB", "fwd s", "bwd s", "total s", "mem ratio", "time ratio"]
    body = [
        [r["variant"], r["mode"], f"{r['peak_gb']:.3f}", f"{r['fwd_s']:.3f}", f"{r['bwd_s']:.3f}",
         f"{r['total_s']:.3f}", f"{r['memory_ratio']:.3f}", f"{r['time_ratio']:.3f}"]
        for r in token_rows
    ]  # fmt: skip
    oh = None
    if overhead:
        oh = [
            ["shape (B x T), V, dtype", f"{overhead['shape']}, V={overhead['V']}, {overhead['dtype']}"],
            ["GRPO step, no entropy (median s)", f"{overhead['grpo_no_entropy_step_s']:.4f}"],
            ["GRPO step (median s)", f"{overhead['grpo_step_s']:.4f}"],
            ["AEM+ActFocus step (median s)", f"{overhead['aem_actfocus_step_s']:.4f}"],
            ["overhead vs GRPO (target <= 2%)", f"{100 * overhead['overhead_ratio']:+.2f}%"],
            ["overhead vs GRPO without entropy", f"{100 * overhead['overhead_ratio_vs_no_entropy']:+.2f}%"],
            ["AEM+ActFocus math alone", f"{overhead['aem_actfocus_math_s'] * 1e3:.2f} ms "
             f"({100 * overhead['aem_actfocus_math_ratio']:.3f}% of a GRPO step)"],
        ]  # fmt: skip
    try:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=None if sys.stdout.isatty() else 140)
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="right" if h not in ("variant", "mode") else "left", no_wrap=True)
        for row in body:
            table.add_row(*row)
        console.print(table)
        if token_rows:
            console.print(f"best chunk size (training time, memory ratio <= {MEMORY_TARGET}): {best}")
        if oh:
            t2 = Table(title="loss step: AEM + ActFocus vs plain GRPO")
            t2.add_column("what", no_wrap=True)
            t2.add_column("value", justify="right")
            for row in oh:
                t2.add_row(*row)
            console.print(t2)
            console.print(overhead["note"])
    except ImportError:
        print(title)
        for row in [head, *body]:
            print("  ".join(f"{c:>12s}" for c in row))
        if token_rows:
            print(f"best chunk size (training time, memory ratio <= {MEMORY_TARGET}): {best}")
        for row in oh or []:
            print(f"{row[0]:>32s}: {row[1]}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--T", type=int, default=4096, help="tokens of the token_statistics comparison (B=1)")
    parser.add_argument("--H", type=int, default=896, help="hidden size (Qwen2.5-0.5B: 896)")
    parser.add_argument("--V", type=int, default=151936, help="vocabulary (Qwen2.5: 151936)")
    parser.add_argument(
        "--chunk-size",
        default=None,
        help="comma-separated chunk sizes to try (default: 512,1024 CPU; 2048,4096,8192 CUDA)",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="input dtype (default: fp32 CPU, bf16 CUDA)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed runs per measurement (default 1 CPU, 5 CUDA)"
    )
    parser.add_argument(
        "--overhead-shape",
        default=None,
        help="BxT of the loss-step comparison (default 8x256 CPU, 8x4096 CUDA)",
    )
    parser.add_argument(
        "--overhead-V", type=int, default=None, help="vocabulary of the loss-step comparison (default --V)"
    )
    parser.add_argument("--overhead-repeats", type=int, default=None, help="default 3 CPU, 10 CUDA")
    parser.add_argument("--skip-token-stats", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench_out/bench_algo.json"))
    ns = parser.parse_args()

    cuda = ns.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    chunks = [int(c) for c in (ns.chunk_size or ("2048,4096,8192" if cuda else "512,1024")).split(",")]
    ob, ot = map(int, (ns.overhead_shape or ("8x4096" if cuda else "8x256")).lower().split("x"))
    args = {
        "device": ns.device,
        "T": ns.T,
        "H": ns.H,
        "V": ns.V,
        "dtype": ns.dtype or ("bfloat16" if cuda else "float32"),
        "repeats": ns.repeats or (5 if cuda else 1),
        "threads": torch.get_num_threads(),
        "overhead_B": ob,
        "overhead_T": ot,
        "overhead_V": ns.overhead_V or ns.V,
        "overhead_repeats": ns.overhead_repeats or (10 if cuda else 3),
    }
    meta = {
        **args,
        "chunk_sizes": chunks,
        "torch": torch.__version__,
        "machine": torch.cuda.get_device_name()
        if cuda
        else f"{platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {args['threads']} torch threads",
        "compute": "naive: fp32 logits from an fp32 matmul (TF32 off, PyTorch default); naive_lowp: "
        "input-dtype matmul, then .float(); chunked: fp32 logits, on CUDA with bf16/fp16 inputs from "
        "tensor-core matmuls accumulating in fp32 (torch.mm out_dtype), grad_z rounded to the input dtype",
    }
    print(f"bench_algo: {meta['machine']}, torch {torch.__version__}, inputs {args['dtype']}", flush=True)
    token_rows, best, overhead = [], chunks[0], None
    if not ns.skip_token_stats:
        print(f"token_statistics vs naive at T={ns.T}, H={ns.H}, V={ns.V}, chunks {chunks}", flush=True)
        token_rows, best = bench_token_stats(args, chunks)
    if not ns.skip_overhead:
        print(f"loss step overhead at {ob}x{ot}, V={args['overhead_V']}, chunk {best}", flush=True)
        overhead = bench_overhead(args, best)
    print_tables(token_rows, best, overhead, meta)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(
        json.dumps(
            {"meta": meta, "token_statistics": token_rows, "best_chunk_size": best, "overhead": overhead},
            indent=2,
        )
    )
    print(f"wrote {ns.out}")


if __name__ == "__main__":
    main()
