"""Rollout benchmark (one run, JSON out): episodes/s and generated tokens/s of the episode runner at
concurrency 1, 8 and 32, with the tiny random-init Qwen2 on HFEngine (and on a vLLM CPU server with
--vllm), scripted tool calls against real Docker sandboxes; and how much of the time the engine
sits idle waiting on sandboxes.

Each turn the engine really decodes `--gen-tokens` tokens with the model (batched across episodes,
so the model cost is real); the turn the episode receives is then a scripted tool call (a random
model writes no valid call), so every turn also runs a real command in the episode's sandbox. A
benchmark-only wrapper, not a fake of anything: its token counts are the model's.

Run: .venv/bin/python scripts/bench_rollout.py [--vllm] [--out bench_out/bench_rollout.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from swerl.agent import ToolEnv, load_tokenizer, tool_call_text
from swerl.rollout import EpisodeSpec, HFEngine, VLLMEngine, make_tiny_qwen, run_episodes
from swerl.sandbox import SandboxSpec
from swerl.structs import EpisodeLimits, Generation, SamplingParams, VLLMServerConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [tool_call_text("bash", {"command": c}) for c in ("ls /", "echo hello > /tmp/x && cat /tmp/x", "uname -a")]


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


async def bench_engine(name: str, engine: Any, tok: Any, spec: SandboxSpec, args: argparse.Namespace) -> list[dict]:
    rows = []
    for conc in args.concurrency:
        n_eps = max(conc, args.min_episodes)
        wrapper = ScriptedTurnsOnRealDecode(engine, tok, args.gen_tokens)
        busy0 = getattr(engine, "busy_s", None)
        specs = [EpisodeSpec(f"bench-{i}", i, 0, lambda sb: ToolEnv(sb, "Look around."), spec) for i in range(n_eps)]
        t0 = time.monotonic()
        results = await run_episodes(specs, wrapper, tok, limits=EpisodeLimits(max_turns=len(SCRIPT)),
                                     max_episodes=conc, engine_concurrency=conc, warm=min(conc, 8),
                                     max_containers=conc + 2, progress=False)
        wall = time.monotonic() - t0
        ok = [r for r in results if r.ok]
        st = [r.stats for r in results]
        sum_wall = sum(s.wall_s for s in st)
        row = {"engine": name, "concurrency": conc, "episodes": n_eps, "failed": n_eps - len(ok), "wall_s": wall,
               "episodes_per_s": n_eps / wall, "generated_tokens_per_s": wrapper.model_tokens / wall,
               "model_tokens": wrapper.model_tokens,
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
    model_dir = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied", tie_word_embeddings=False,
                               tokenizer=tok)
    spec = SandboxSpec(image=args.image, workdir="/tmp", memory="256m")
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                           "model": "tiny random-init Qwen2 (hidden 128, 2 layers, head_dim 64, vocab 151936)",
                           "turns_per_episode": len(SCRIPT), "gen_tokens_per_turn": args.gen_tokens, "runs": []}
    hf = HFEngine(model_dir, seed=0, max_batch=64)
    out["runs"] += await bench_engine("hf", hf, tok, spec, args)
    await hf.close()
    if args.vllm:
        cfg = VLLMServerConfig(model_path=str(model_dir), python=str(ROOT / ".venv-vllm" / "bin" / "python"),
                               port=18765, dtype="float32", max_model_len=4096, startup_timeout_s=400,
                               extra_args=("--gpu-memory-utilization", "0.1"), env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
        vllm = await VLLMEngine.start(cfg, log_dir=ROOT / "bench_out")
        try:
            out["runs"] += await bench_engine("vllm-cpu", vllm, tok, spec, args)
        finally:
            await vllm.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--min-episodes", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--image", default="swerl-base:latest")
    ap.add_argument("--vllm", action="store_true", help="also bench a vllm-cpu server (.venv-vllm)")
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_rollout.json"))
    a = ap.parse_args()
    result = asyncio.run(main(a))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.out}")
