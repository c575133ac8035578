"""What the hf engine's continuous batching, prefix cache and in-place KV cache buy a multi-turn rollout,
one run: the same game episodes (by default 32 FrozenLake 3x3 games of up to 6 turns, SmolLM2-135M-Instruct
at T = 1, as the credit-assignment experiment samples them) played in up to four settings, each adding one
thing to the one before:
  static     static batches, every prompt prefilled whole (a batch runs to its longest row, and requests
             that arrive meanwhile wait for the next), transformers' KV cache (copied every token);
  continuous rows that arrive join the running batch;
  cached     each episode's keys and values kept between its turns (the prefix cache);
  in_place   decode steps write their keys and values into spare room of the cache instead of copying
             it (swerl.rollout.kv_cache): the engine as it runs by default.

Reported per setting: wall seconds, episodes/s, generated tokens/s, and the prompt tokens fed through
the model (prefilled) vs taken from the cache. All settings sample with the same seed, but batches form
differently and cached rows' float32 sums run in another order, so a sampled token can come out
differently and the episodes need not be token for token the same: compare generated tokens/s and the
prefill counts, not the turn counts. On 2 shared CPU cores read the ratios.

    .venv/bin/python scripts/bench_hf_engine.py [--model smollm2-135m-instruct] [--games 32]
        [--kind frozenlake] [--data size=3] [--settings static,continuous,cached,in_place]
        [--out bench_out/bench_hf_engine.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from swerl.agent import load_tokenizer
from swerl.envs.registry import game_kind
from swerl.envs.textgame.tasks import GameTaskConfig, GameTaskSet
from swerl.files import atomic_write
from swerl.models.shipped import resolve_model
from swerl.rollout import HFEngine, run_episodes
from swerl.structs import EpisodeLimits, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


SETTINGS = {  # name: (continuous, prefix cache on, kv headroom)
    "static": (False, False, 0), "continuous": (True, False, 0), "cached": (True, True, 0),
    "in_place": (True, True, 128)}


def play(model_dir: Path, tok: Any, args: argparse.Namespace, setting: str) -> dict[str, Any]:
    continuous, cached, headroom = SETTINGS[setting]
    cache_mb = args.cache_mb if cached else 0.0
    kind, listing = game_kind(args.kind)
    tasks = GameTaskSet(args.kind, listing, GameTaskConfig(data=args.data, split="heldout", limit=args.games,
                                                           sandbox=False), max_steps=args.max_turns)
    specs = [s for g, tid in enumerate(tasks.ids) for s in tasks.specs(tid, g, 1)]
    engine = HFEngine(model_dir, seed=0, max_batch=64, prefix_cache_mb=cache_mb, continuous=continuous,
                      kv_headroom=headroom)
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    t0 = time.monotonic()
    results = asyncio.run(run_episodes(specs, engine, tok, params=params,
                                       limits=EpisodeLimits(max_turns=args.max_turns), progress=False))
    wall = time.monotonic() - t0
    asyncio.run(engine.close())
    trajs = [r.trajectory for r in results if r.trajectory is not None]
    generated = sum(sum(t.loss_mask) for t in trajs)
    return {"setting": setting, "continuous": continuous, "prefix_cache_mb": cache_mb,
            "kv_headroom": headroom, "joined": engine.joined,
            "batches": engine.batches, "wall_s": round(wall, 2), "episodes": len(trajs),
            "failed": len(results) - len(trajs), "turns": sum(t.num_turns for t in trajs),
            "generated_tokens": generated, "prefilled_tokens": engine.prefill_tokens,
            "cached_tokens": engine.cached_tokens, "episodes_per_s": round(len(trajs) / wall, 4),
            "generated_tokens_per_s": round(generated / wall, 2),
            "won": sum(kind.success(t) for t in trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="an HF directory or a shipped model's name")
    ap.add_argument("--kind", default="frozenlake", help="a game kind (frozenlake, sokoban, ...)")
    ap.add_argument("--data", default="size=3", help="the game's generator options")
    ap.add_argument("--games", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--cache-mb", type=float, default=1024, help="the prefix cache of the cached run")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"comma-separated, in order, the first the baseline: {', '.join(SETTINGS)}")
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_hf_engine.json"))
    args = ap.parse_args()
    settings = args.settings.split(",")
    if not settings or any(x not in SETTINGS for x in settings):
        ap.error(f"--settings: choose from {', '.join(SETTINGS)}, got {args.settings!r}")
    model_dir = Path(resolve_model(args.model, log=print))
    tok = load_tokenizer(model_dir)
    runs = [play(model_dir, tok, args, x) for x in settings]
    base = runs[0]
    result = {"model": args.model, "kind": args.kind, "data": args.data, "games": args.games,
              "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
              "temperature": args.temperature, "runs": runs,
              # each setting's generated tokens/s over the first's, and over the one before it
              "speedup_generated_tokens_per_s": {
                  r["setting"]: round(r["generated_tokens_per_s"] / base["generated_tokens_per_s"], 3)
                  for r in runs[1:]},
              "speedup_over_previous": {
                  r["setting"]: round(r["generated_tokens_per_s"] / p["generated_tokens_per_s"], 3)
                  for p, r in itertools.pairwise(runs)},
              "prefill_reduction": round(base["prefilled_tokens"] / max(1, runs[-1]["prefilled_tokens"]), 3),
              "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(),
                          "torch": torch.__version__},
              "created": time.strftime("%Y-%m-%d %H:%M:%S")}

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{args.model} on {args.games} {args.kind} games ({args.data}), hf engine settings")
    for c in ("setting", "prefix cache", "kv headroom", "joined", "wall s", "episodes", "turns", "generated",
              "gen tok/s", "prefilled", "cached"):
        t.add_column(c, justify="right")
    for r in runs:
        t.add_row(r["setting"], f"{r['prefix_cache_mb']:g} MB", str(r["kv_headroom"]), str(r["joined"]),
                  f"{r['wall_s']:.0f}", str(r["episodes"]), str(r["turns"]),
                  str(r["generated_tokens"]), f"{r['generated_tokens_per_s']:.1f}",
                  str(r["prefilled_tokens"]), str(r["cached_tokens"]))
    Console().print(t)
    sp, prev = result["speedup_generated_tokens_per_s"], result["speedup_over_previous"]
    print(f"generated tokens/s vs {base['setting']}: "
          + ", ".join(f"{k} {v}x (over the setting before: {prev[k]}x)" for k, v in sp.items())
          + f"; prompt tokens prefilled, first / last setting: {result['prefill_reduction']}x")
    out = Path(args.out)
    atomic_write(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
