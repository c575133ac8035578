"""A real model's speed on this machine, one run: generated tokens/s of SmolLM2-135M-Instruct (or --model)
on the in-process hf engine vs a real vLLM CPU server at concurrency 1 / 8 / 32, and the learner's tokens/s
on the same model (one GRPO update, and with AEM + ActFocus).

Each generate call is one chat prompt of the model's own template (the messages cycle) sampled at T = 1
for exactly --tokens tokens (no stop ids: every engine samples on past the model's end-of-turn token, so
every call does the same work); a level runs once to warm up, then --repeats times; tokens/s is all
generated tokens over the wall time of the level's calls running at once. Both engines run float32 on
the same weights (the vLLM server at `--dtype float32`, compiled, as `swerl train` launches it). The
learner's batch is bench_train.py's synthetic multi-turn episodes over this model's vocabulary. On 2
shared CPU cores read the ratios: hf vs vLLM per level, and the scaling over levels.

    .venv/bin/python scripts/bench_generate.py [--model smollm2-135m-instruct] [--levels 1,8,32]
        [--engines hf,vllm] [--tokens 64] [--out bench_out/bench_generate.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "rollout"), str(ROOT / "scripts")]

from contract import engine_reference as conf  # noqa: E402  (engines opened as the conformance suite opens them)

from swerl.agent import load_tokenizer  # noqa: E402
from swerl.files import atomic_write  # noqa: E402
from swerl.models.shipped import resolve_model  # noqa: E402
from swerl.structs import SamplingParams  # noqa: E402

MESSAGES = ("Write a function that reverses a list.", "Fix mean() in calc.", "What is 2+2?",
            "Run the tests and fix the bug.", "List the files in /testbed.", "Explain what a patch is.")


async def level(engine: Any, prompts: list[list[int]], tokens: int) -> float:
    """Seconds for len(prompts) generate calls at once."""
    p = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(q, p) for q in prompts))
    dt = time.perf_counter() - t0
    got = [len(g.token_ids) for g in gens]
    if got != [tokens] * len(prompts):
        raise RuntimeError(f"expected {tokens} tokens per call, got {sorted(set(got))}")
    return dt


def generation(kind: str, model_dir: Path, tok: Any, args: argparse.Namespace) -> dict[str, Any]:
    prompts_all = [conf.chat_prompt(tok, m) for m in MESSAGES]
    out: dict[str, Any] = {}
    with conf.open_engine(kind, model_dir, tok, log_dir=ROOT / ".cache" / "bench_generate_logs",
                          eager=False) as engine:
        for c in args.levels:
            prompts = [prompts_all[i % len(prompts_all)] for i in range(c)]
            asyncio.run(level(engine, prompts, args.tokens))  # warm-up
            runs = [asyncio.run(level(engine, prompts, args.tokens)) for _ in range(args.repeats)]
            s = statistics.median(runs)
            out[str(c)] = {"concurrency": c, "seconds": s, "tokens_per_s": c * args.tokens / s,
                           "runs_s": runs}
            print(f"[{kind}] concurrency {c}: {c * args.tokens / s:.1f} tokens/s", flush=True)
    return out


def learner(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """tokens/s of one Learner.update on bench_train.py's synthetic batch over this model's vocabulary."""
    import bench_train as bt
    from transformers import AutoModelForCausalLM

    from swerl.learner import ActFocusConfig, AEMConfig, AlgoConfig, Learner, OptimConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ns = argparse.Namespace(seed=0, episodes=args.learner_episodes, tokens=args.learner_tokens, jitter=0.25,
                            vocab=model.config.vocab_size, chunk_size=1024, obs_max=64)
    batch = bt.make_batch(ns, model, torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
    out: dict[str, Any] = {}
    for name, algo in (("grpo", AlgoConfig()),
                       ("aem_actfocus", AlgoConfig(aem=AEMConfig(enabled=True),
                                                   actfocus=ActFocusConfig(enabled=True)))):
        lrn = Learner(model, algo, OptimConfig(lr=1e-7, micro_batch_tokens=4096, chunk_size=1024))
        lrn.update(batch)  # warm-up
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            m = lrn.update(batch)
            runs.append(time.perf_counter() - t0)
            assert not m.skipped
        s = statistics.median(runs)
        out[name] = {"update_s": s, "tokens_per_s": int(batch.lengths.sum()) / s, "runs_s": runs}
        print(f"[learner] {name}: {out[name]['tokens_per_s']:.0f} tokens/s", flush=True)
    out["batch"] = {"episodes": batch.size, "tokens": int(batch.lengths.sum())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="an HF directory or a shipped model's name")
    ap.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm, sglang")
    ap.add_argument("--levels", default="1,8,32", help="concurrent generate calls")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--learner-episodes", type=int, default=8)
    ap.add_argument("--learner-tokens", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_generate.json"))
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model_dir = Path(resolve_model(args.model, log=print))
    tok = load_tokenizer(model_dir)
    result: dict[str, Any] = {"model": args.model, "tokens_per_call": args.tokens, "levels": args.levels,
                              "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(),
                                          "torch": torch.__version__},
                              "created": time.strftime("%Y-%m-%d %H:%M:%S"), "generation": {}}
    for kind in [k.strip() for k in args.engines.split(",") if k.strip()]:
        try:
            result["generation"][kind] = generation(kind, model_dir, tok, args)
        except Exception as e:
            result["generation"][kind] = {"error": f"{type(e).__name__}: {e}"[:1000]}
            print(f"[{kind}] {result['generation'][kind]['error']}", flush=True)
    result["learner"] = learner(model_dir, args)

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{args.model}: generated tokens/s ({args.tokens} per call, T = 1), learner tokens/s")
    t.add_column("what")
    for c in args.levels:
        t.add_column(f"concurrency {c}", justify="right")
    gen = result["generation"]
    for kind, r in gen.items():
        t.add_row(kind, *(f"{r[str(c)]['tokens_per_s']:.1f}" if str(c) in r else r.get("error", "-")[:40]
                          for c in args.levels))
    if "hf" in gen and "vllm" in gen and "error" not in gen["hf"] and "error" not in gen["vllm"]:
        ratio = [gen["vllm"][str(c)]["tokens_per_s"] / gen["hf"][str(c)]["tokens_per_s"] for c in args.levels]
        t.add_row("vllm / hf", *(f"{x:.2f}x" for x in ratio))
    lr = result["learner"]
    t.add_row("learner: GRPO update", f"{lr['grpo']['tokens_per_s']:.0f}", "", "")
    t.add_row("learner: + AEM + ActFocus", f"{lr['aem_actfocus']['tokens_per_s']:.0f}", "", "")
    Console().print(t)
    out = Path(args.out)
    atomic_write(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
