"""Async training throughput and learning: steps per hour of the synchronous loop against rollouts
overlapped with learning (`async.max_staleness` 1 and 2) and partial rollouts, on a long-tail env; and
whether async k = 1 with the off-policy correction learns as fast (in steps) as the synchronous loop.

The long-tail env is the toy game (configs/toy_cpu.yaml, hf engine, the tiny model) with injected
per-episode env time (`env.toy.latency_median_s`, `env.toy.latency_sigma`): after its last turn each
episode sleeps a time drawn from a lognormal with median M and log-σ S (defaults 0.25 s and 1.0: mean
1.65 M, the slowest of a 32-episode step ~8 M), from the run's seeded task stream, as a slow
sandbox, tool or grading would take. In the synchronous loop a step waits for its slowest episode;
async steps take the first groups to finish.

The same variants run again with the vLLM CPU server (.venv-vllm) as the rollout engine (`--engines`),
on a text game played through the agent loop: FrozenLake in process (`env.frozenlake.sandbox=false`,
configs/debug_cpu.yaml's tiny random-init Qwen2 with the real vocabulary, untied for vLLM's reload),
with latency from the same lognormal (`env.frozenlake.latency_median_s`, `latency_sigma`: drawn per
episode in the task set, slept by the episode runner after the episode). One server, launched once and
attached to by every variant (`rollout.vllm.urls`), reset to the initial weights before each; weights
sync through a checkpoint directory the server reloads. A random model wins no game, so these rows are
throughput only.

Steps per hour = steps / the seconds of the training loop (the sum of `timing_s/step`, setup and export
excluded); the wall time of each whole run is reported too. The learning check runs the plain toy game
(no latency) for `--learn-steps` steps, same seeds: the step at which each run's trailing 5-step mean
reward first reaches 90 % of the synchronous run's final 5-step mean, and their ratio (target ≤ 1.2).

Usage:
    python scripts/bench_async.py                 # ~3-4 minutes on 2 CPU cores; JSON in bench_out/
    python scripts/bench_async.py --steps 20 --median 0.5
    python scripts/bench_async.py --engines vllm  # vLLM rows only; the hf rows of --out are kept

On a shared machine the absolute numbers move with the load; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swerl.config import load
from swerl.train import TrainConfig, train

CONFIG = "configs/toy_cpu.yaml"
VARIANTS: dict[str, list[str]] = {
    "sync": [],
    "async_k1": ["async.max_staleness=1"],
    "async_k2": ["async.max_staleness=2"],
    "partial_k1": ["async.max_staleness=1", "async.partial_rollouts=true"],
    "partial_k2": ["async.max_staleness=2", "async.partial_rollouts=true"],
}
VLLM_CONFIG = "configs/debug_cpu.yaml"
VLLM_GAME = ["env.kind=frozenlake", "env.frozenlake.sandbox=false", "rollout.engine=vllm",
             "rollout.max_new_tokens=24", "rollout.max_turns=3", "rollout.max_context_tokens=4096",
             "rollout.max_episodes=8", "group_size=2"]
CORRECTION = ["algo.recompute_old_logp=true", "algo.rollout_is.mode=truncate", "algo.rollout_is.cap=2.0"]


def _run(run_dir: Path, overrides: list[str], config: str = CONFIG) -> tuple[list[dict[str, Any]], float]:
    cfg = load(TrainConfig, config, [f"run_dir={run_dir}", "checkpoint_every=0", "export_final=false",
                                     "eval_every=0", "metrics.progress=false", *overrides])
    t0 = time.perf_counter()
    rows = train(cfg, log=None)
    return rows, time.perf_counter() - t0


def _throughput(rows: list[dict[str, Any]], wall: float, extra: list[str]) -> dict[str, Any]:
    loop_s = sum(r["timing_s/step"] for r in rows)
    return {
        "overrides": extra, "steps": len(rows), "loop_s": loop_s, "wall_s": wall,
        "steps_per_hour": 3600 * len(rows) / loop_s,
        "rollout_wait_s_mean": sum(r["timing_s/rollout"] for r in rows) / len(rows),
        "learn_s_mean": sum(r["timing_s/learn"] for r in rows) / len(rows),
        "sync_s_mean": sum(r["timing_s/sync"] for r in rows) / len(rows),
        "dropped_stale": sum(r.get("async/dropped_stale", 0) for r in rows),
        "staleness_mean": (sum(r.get("async/staleness_mean", 0) for r in rows) / len(rows)),
        "reward_mean": sum(r["reward/mean"] for r in rows) / len(rows),
    }


def _vllm_rows(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The variants on one vLLM CPU server (see the module docstring): {env, throughput}."""
    from swerl.agent import load_tokenizer
    from swerl.models import make_tiny_qwen
    from swerl.rollout import VLLMEngine
    from swerl.rollout.config import VLLMServerConfig

    env = [f"env.frozenlake.latency_median_s={args.median}", f"env.frozenlake.latency_sigma={args.sigma}"]
    common = [*VLLM_GAME, f"steps={args.vllm_steps}", f"batch_episodes={args.vllm_batch}",
              f"seed={args.seed}", *env]
    m = load(TrainConfig, VLLM_CONFIG, common).model
    init = make_tiny_qwen(tmp / "vllm_init", hidden_size=m.hidden_size, num_layers=m.num_layers,
                          num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                          intermediate_size=m.intermediate_size, seed=m.seed, tie_word_embeddings=False,
                          tokenizer=load_tokenizer())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    python = os.environ.get("SWERL_VLLM_PYTHON") or str(Path(__file__).resolve().parents[1] / ".venv-vllm"
                                                        / "bin" / "python")
    t0 = time.perf_counter()
    server = asyncio.run(VLLMEngine.start(VLLMServerConfig(
        model_path=str(init), python=python, port=port, dtype="float32", max_model_len=4096,
        startup_timeout_s=600, extra_args=("--gpu-memory-utilization", "0.1"),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"),)), log_dir=tmp))
    out: dict[str, Any] = {
        "env": {"config": VLLM_CONFIG, "overrides": common, "game": "frozenlake (in process, agent loop)",
                "latency": f"lognormal(median={args.median} s, sigma={args.sigma}) per episode, after it "
                           "ends", "steps": args.vllm_steps, "batch_episodes": args.vllm_batch,
                "seed": args.seed, "engine": "vllm (CPU server, attached; weights reloaded from disk)",
                "server_start_s": time.perf_counter() - t0},
        "throughput": {}}
    try:
        for name, extra in VARIANTS.items():
            asyncio.run(server.update_weights(init))  # every variant starts from the initial policy
            rows, wall = _run(tmp / f"vllm_{name}", [*common, f"model.path={init}",
                                                     f"rollout.vllm.urls=[http://127.0.0.1:{port}]", *extra],
                              config=VLLM_CONFIG)
            out["throughput"][name] = _throughput(rows, wall, extra)
            print(f"{name:>11}: {out['throughput'][name]['steps_per_hour']:8.0f} steps/h (vllm)", flush=True)
    finally:
        asyncio.run(server.close())
    base = out["throughput"]["sync"]["steps_per_hour"]
    for v in out["throughput"].values():
        v["speedup_vs_sync"] = v["steps_per_hour"] / base
    return out


def _table(title: str, throughput: dict[str, Any]) -> None:
    print(title)
    print(f"{'variant':>11} {'steps/h':>9} {'× sync':>7} {'rollout wait':>13} {'learn':>7} {'dropped':>8} "
          f"{'staleness':>10}")
    for name, v in throughput.items():
        print(f"{name:>11} {v['steps_per_hour']:9.0f} {v['speedup_vs_sync']:7.2f} "
              f"{v['rollout_wait_s_mean']:12.2f}s {v['learn_s_mean']:6.2f}s {v['dropped_stale']:8d} "
              f"{v['staleness_mean']:10.2f}")


def _trailing(xs: list[float], w: int = 5) -> list[float]:
    return [sum(xs[max(0, i - w + 1):i + 1]) / len(xs[max(0, i - w + 1):i + 1]) for i in range(len(xs))]


def _first_at(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, v in enumerate(curve) if v >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="training steps per throughput run")
    ap.add_argument("--batch", type=int, default=32, help="episodes per step (groups of 8)")
    ap.add_argument("--median", type=float, default=0.25, help="median injected seconds per episode")
    ap.add_argument("--sigma", type=float, default=1.0, help="log-σ of the lognormal latency")
    ap.add_argument("--learn-steps", type=int, default=30, help="steps of the learning check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engines", default="hf,vllm", help="hf, vllm or both (comma-separated)")
    ap.add_argument("--vllm-steps", type=int, default=5, help="training steps per vLLM throughput run")
    ap.add_argument("--vllm-batch", type=int, default=8, help="episodes per vLLM step (groups of 2)")
    ap.add_argument("--out", default="bench_out/bench_async.json")
    args = ap.parse_args()
    engines = set(args.engines.split(","))
    if not engines or engines - {"hf", "vllm"}:
        ap.error(f"--engines: hf, vllm or both, got {args.engines!r}")
    out = Path(args.out)
    if "hf" not in engines:  # keep the hf rows (and the learning check) of an earlier run
        result = json.loads(out.read_text())
        result["host_vllm"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                               "load_avg_at_start": os.getloadavg()}
        with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
            result["vllm"] = _vllm_rows(args, Path(tmp))
        _report(result, out)
        return

    env = [f"env.toy.latency_median_s={args.median}", f"env.toy.latency_sigma={args.sigma}"]
    common = [f"steps={args.steps}", f"batch_episodes={args.batch}", f"seed={args.seed}", *env]
    result: dict[str, Any] = {
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(),
                 "load_avg_at_start": os.getloadavg()},
        "env": {"config": CONFIG, "latency": f"lognormal(median={args.median} s, sigma={args.sigma}) per "
                                             "episode, after its last turn",
                "steps": args.steps, "batch_episodes": args.batch, "seed": args.seed, "engine": "hf"},
        "throughput": {}, "learning": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
        for name, extra in VARIANTS.items():
            rows, wall = _run(Path(tmp) / name, [*common, *extra])
            result["throughput"][name] = _throughput(rows, wall, extra)
            print(f"{name:>11}: {result['throughput'][name]['steps_per_hour']:8.0f} steps/h", flush=True)
        base = result["throughput"]["sync"]["steps_per_hour"]
        for v in result["throughput"].values():
            v["speedup_vs_sync"] = v["steps_per_hour"] / base

        learn = [f"steps={args.learn_steps}", f"seed={args.seed}", *CORRECTION]
        curves = {}
        for name, extra in (("sync", []), ("async_k1_corrected", ["async.max_staleness=1"])):
            rows, wall = _run(Path(tmp) / f"learn_{name}", [*learn, *extra])
            curves[name] = [r["reward/mean"] for r in rows]
            result["learning"][name] = {"overrides": [*CORRECTION, *extra], "rewards": curves[name],
                                        "wall_s": wall}
        final = _trailing(curves["sync"])[-1]
        target = 0.9 * final
        at = {n: _first_at(_trailing(c), target) for n, c in curves.items()}
        result["learning"]["target"] = {"sync_final_trailing5": final, "threshold": target,
                                        "definition": "first step whose trailing 5-step mean reward >= 0.9 × "
                                                      "the sync run's final trailing 5-step mean"}
        result["learning"]["steps_to_target"] = at
        result["learning"]["ratio_async_over_sync"] = (at["async_k1_corrected"] / at["sync"]
                                                       if at["sync"] and at["async_k1_corrected"] else None)
        if "vllm" in engines:
            result["vllm"] = _vllm_rows(args, Path(tmp))
    _report(result, out)


def _report(result: dict[str, Any], out: Path) -> None:
    e = result["env"]
    print()
    _table(f"long-tail toy game: {e['latency']}; {e['steps']} steps of {e['batch_episodes']} episodes, hf",
           result["throughput"])
    if "vllm" in result:
        v = result["vllm"]["env"]
        _table(f"\nlong-tail FrozenLake (agent loop): {v['latency']}; {v['steps']} steps of "
               f"{v['batch_episodes']} episodes, vLLM CPU server", result["vllm"]["throughput"])
    lr = result["learning"]
    print(f"\nlearning (toy, no latency, {len(lr['sync']['rewards'])} steps, correction "
          f"{' '.join(CORRECTION)}):")
    tgt, at = lr["target"], lr["steps_to_target"]
    print(f"  target {tgt['threshold']:.3f} (0.9 × sync final {tgt['sync_final_trailing5']:.3f}); steps to "
          f"reach it: sync {at['sync']}, async k=1 {at['async_k1_corrected']}; ratio "
          f"{lr['ratio_async_over_sync']} (target <= 1.2)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
