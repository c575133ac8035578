"""Rollout benchmark (one run, JSON out): episodes/s and generated tokens/s of the episode runner at
concurrency 1, 8 and 32, with the tiny random-init Qwen2 on HFEngine (and on a vLLM CPU server with
--vllm), scripted tool calls against real Docker sandboxes; and how much of the time the engine
sits idle waiting on sandboxes.

Each turn the engine really decodes `--gen-tokens` tokens with the model (batched across episodes,
so the model cost is real); the turn the episode receives is then a scripted tool call (a random
model writes no valid call), so every turn also runs a real command in the episode's sandbox. A
benchmark-only wrapper, not a fake of anything: its token counts are the model's.

With --warm it measures instead what a sandbox costs each episode of a training run (issue #16): a
few steps of --step-episodes episodes at --warm-concurrency, each step its own `asyncio.run` with a
--learn-s pause between (the learner's turn), as `swerl train` runs them; once per setting of
--warm-values: 0 is the old training setting (the runner's own pool per step, max_containers =
concurrency, nothing made ahead), W > 0 the new one (`SandboxPools(warm=W)` kept across the steps,
max_containers = concurrency + W, as `rollout.warm_sandboxes`). Per episode: seconds waiting for a
sandbox (acquire), and the overhead (wall - engine - sandbox commands) it is part of.

Run: .venv/bin/python scripts/bench_rollout.py [--vllm] [--out bench_out/bench_rollout.json]
     .venv/bin/python scripts/bench_rollout.py --warm [--out bench_out/bench_rollout_warm.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from swerl.agent import ToolEnv, load_tokenizer, tool_call_text
from swerl.models import make_tiny_qwen
from swerl.rollout import EpisodeSpec, HFEngine, VLLMEngine, run_episodes
from swerl.rollout.config import VLLMServerConfig
from swerl.sandbox import SandboxSpec
from swerl.sandbox.pool import SandboxPools
from swerl.structs import EpisodeLimits, Generation, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [tool_call_text("bash", {"command": c})
          for c in ("ls /", "echo hello > /tmp/x && cat /tmp/x", "uname -a")]


class ScriptedTurnsOnRealDecode:
    """Decodes with the real engine, then hands the episode a scripted tool call (see module doc)."""

    def __init__(self, engine: Any, tok: Any, gen_tokens: int) -> None:
        self.engine, self.tok, self.gen_tokens = engine, tok, gen_tokens
        self.model_tokens = 0
        self.busy_s = 0.0
        self._turn_ids = [[*tok(t, add_special_tokens=False)["input_ids"], tok.eos_token_id] for t in SCRIPT]
        self._im_start = tok.convert_tokens_to_ids("<|im_start|>")

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        g = await self.engine.generate(prompt_ids, SamplingParams(max_new_tokens=self.gen_tokens))
        self.model_tokens += len(g.token_ids)
        k = min(prompt_ids.count(self._im_start) - 3, len(SCRIPT) - 1)  # system, user, first assistant
        ids = self._turn_ids[k]
        return Generation(tuple(ids), tuple([-1.0] * len(ids)), "stop")


async def bench_engine(name: str, engine: Any, tok: Any, spec: SandboxSpec,
                       args: argparse.Namespace) -> list[dict]:
    rows = []
    for conc in args.concurrency:
        n_eps = max(conc, args.min_episodes)
        wrapper = ScriptedTurnsOnRealDecode(engine, tok, args.gen_tokens)
        busy0 = getattr(engine, "busy_s", None)
        specs = [EpisodeSpec(f"bench-{i}", i, 0, lambda sb: ToolEnv(sb, "Look around."), spec)
                 for i in range(n_eps)]
        t0 = time.monotonic()
        results = await run_episodes(specs, wrapper, tok, limits=EpisodeLimits(max_turns=len(SCRIPT)),
                                     max_episodes=conc, engine_concurrency=conc, warm=min(conc, 8),
                                     max_containers=conc + 2, progress=False)
        wall = time.monotonic() - t0
        ok = [r for r in results if r.ok]
        st = [r.stats for r in results]
        sum_wall = sum(s.wall_s for s in st)
        row = {"engine": name, "concurrency": conc, "episodes": n_eps, "failed": n_eps - len(ok),
               "wall_s": wall, "episodes_per_s": n_eps / wall,
               "generated_tokens_per_s": wrapper.model_tokens / wall, "model_tokens": wrapper.model_tokens,
               "episode_time_share": {"engine": sum(s.engine_s for s in st) / sum_wall,
                                      "engine_queue": sum(s.engine_queue_s for s in st) / sum_wall,
                                      "env_sandbox": sum(s.env_s for s in st) / sum_wall,
                                      "sandbox_acquire": sum(s.sandbox_acquire_s for s in st) / sum_wall}}
        if busy0 is not None:
            # the engine decodes only while some episode waits for it; the rest of the wall time it
            # is idle because every episode is in its sandbox (or being set up)
            row["engine_idle_share"] = 1 - (engine.busy_s - busy0) / wall
        rows.append(row)
        print(json.dumps(row))
    return rows


async def main(args: argparse.Namespace) -> dict:
    tok = load_tokenizer()
    model_dir = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied",
                               tie_word_embeddings=False, tokenizer=tok)
    spec = SandboxSpec(image=args.image, workdir="/tmp", memory="256m")
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                           "model": "tiny random-init Qwen2 (hidden 128, 2 layers, head_dim 64, vocab "
                                    "151936)",
                           "turns_per_episode": len(SCRIPT), "gen_tokens_per_turn": args.gen_tokens,
                           "runs": []}
    hf = HFEngine(model_dir, seed=0, max_batch=64)
    out["runs"] += await bench_engine("hf", hf, tok, spec, args)
    await hf.close()
    if args.vllm:
        cfg = VLLMServerConfig(model_path=str(model_dir), python=str(ROOT / ".venv-vllm" / "bin" / "python"),
                               port=18765, dtype="float32", max_model_len=4096, startup_timeout_s=400,
                               extra_args=("--gpu-memory-utilization", "0.1"),
                               env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
        vllm = await VLLMEngine.start(cfg, log_dir=ROOT / "bench_out")
        try:
            out["runs"] += await bench_engine("vllm-cpu", vllm, tok, spec, args)
        finally:
            await vllm.close()
    return out


def _q(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1] if len(xs) > 1 else xs[0]


def bench_warm(args: argparse.Namespace) -> dict:
    """Per-episode sandbox overhead over training-like steps, for each --warm-values setting."""
    tok = load_tokenizer()
    model_dir = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied",
                               tie_word_embeddings=False, tokenizer=tok)
    spec = SandboxSpec(image=args.image, workdir="/tmp", memory="256m")
    conc = args.warm_concurrency
    hf = HFEngine(model_dir, seed=0, max_batch=64)
    wrapper = ScriptedTurnsOnRealDecode(hf, tok, args.gen_tokens)
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                           "concurrency": conc, "steps": args.steps, "episodes_per_step": args.step_episodes,
                           "learn_pause_s": args.learn_s, "turns_per_episode": len(SCRIPT),
                           "gen_tokens_per_turn": args.gen_tokens, "settings": []}

    def run_steps(warm: int, step_s: list[float]) -> list[list[Any]]:
        def step(k: int, pools: SandboxPools | None) -> list[Any]:
            specs = [EpisodeSpec(f"s{k}-{i}", i, 0, lambda sb: ToolEnv(sb, "Look around."), spec)
                     for i in range(args.step_episodes)]
            kw: dict[str, Any] = {"pools": pools} if pools else {"warm": 0, "max_containers": conc}
            t = time.monotonic()
            results = asyncio.run(run_episodes(specs, wrapper, tok,
                                               limits=EpisodeLimits(max_turns=len(SCRIPT)), max_episodes=conc,
                                               engine_concurrency=conc, progress=False, **kw))
            step_s.append(time.monotonic() - t)
            return results

        steps = []
        if warm == 0:  # the old training loop: a pool made and removed by each step's run_episodes
            for k in range(args.steps):
                steps.append(step(k, None))
                time.sleep(args.learn_s)
            return steps
        with SandboxPools(warm=warm, max_containers=conc + warm) as pools:  # the new: kept across steps
            for k in range(args.steps):
                steps.append(step(k, pools))
                time.sleep(args.learn_s)
        return steps

    for warm in args.warm_values:
        t0 = time.monotonic()
        step_s: list[float] = []
        steps = run_steps(warm, step_s)
        wall = time.monotonic() - t0
        st = [r.stats for results in steps for r in results]
        acq = [s.sandbox_acquire_s for s in st]
        over = [s.wall_s - s.engine_s - s.env_s for s in st]
        later = [s.sandbox_acquire_s for results in steps[1:] for s in (r.stats for r in results)]
        row = {"warm": warm, "max_containers": conc + warm, "episodes": len(st),
               "failed": sum(not r.ok for results in steps for r in results),
               "acquire_s": {"p50": _q(acq, 0.5), "p90": _q(acq, 0.9), "mean": statistics.fmean(acq)},
               "acquire_s_p50_steps_after_the_first": _q(later, 0.5) if later else None,
               "overhead_s": {"p50": _q(over, 0.5), "mean": statistics.fmean(over)},
               "acquire_share_of_episode": sum(acq) / sum(s.wall_s for s in st),
               "acquire_share_of_overhead": sum(acq) / sum(over),
               "episode_wall_s_p50": _q([s.wall_s for s in st], 0.5),
               "step_wall_s": step_s,
               "total_s": wall}
        out["settings"].append(row)
        print(json.dumps(row), flush=True)
    asyncio.run(hf.close())

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"sandbox cost per episode: {args.steps} steps x {args.step_episodes} episodes at "
                    f"concurrency {conc}, {args.learn_s:g} s between steps")
    for col in ("warm", "max containers", "acquire p50 s", "acquire p90 s", "acquire p50 s (steps 2+)",
                "acquire share of episode", "overhead p50 s", "acquire share of overhead", "episode p50 s",
                "step s (mean)", "failed"):
        t.add_column(col, justify="right")
    for r in out["settings"]:
        later = r["acquire_s_p50_steps_after_the_first"]
        t.add_row(str(r["warm"]), str(r["max_containers"]), f"{r['acquire_s']['p50']:.3f}",
                  f"{r['acquire_s']['p90']:.3f}", "-" if later is None else f"{later:.3f}",
                  f"{100 * r['acquire_share_of_episode']:.1f}%", f"{r['overhead_s']['p50']:.3f}",
                  f"{100 * r['acquire_share_of_overhead']:.1f}%", f"{r['episode_wall_s_p50']:.2f}",
                  f"{statistics.fmean(r['step_wall_s']):.1f}", str(r["failed"]))
    Console(width=200).print(t)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--min-episodes", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--image", default="swerl-base:latest")
    ap.add_argument("--vllm", action="store_true", help="also bench a vllm-cpu server (.venv-vllm)")
    ap.add_argument("--out", default=None,
                    help="default bench_out/bench_rollout.json (--warm: bench_rollout_warm.json)")
    ap.add_argument("--warm", action="store_true",
                    help="measure the sandbox cost per episode over training-like "
                    "steps instead, for each --warm-values setting (see the module doc)")
    ap.add_argument("--warm-values", type=int, nargs="+", default=[0, 2, 8])
    ap.add_argument("--warm-concurrency", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--step-episodes", type=int, default=16)
    ap.add_argument("--learn-s", type=float, default=3.0,
                    help="--warm: pause between steps (the learner's turn)")
    a = ap.parse_args()
    a.out = a.out or str(ROOT / "bench_out" / ("bench_rollout_warm.json" if a.warm else "bench_rollout.json"))
    result = bench_warm(a) if a.warm else asyncio.run(main(a))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.out}")
