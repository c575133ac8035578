"""What giving the C heap's free pages back (`swerl.heap.release_free_memory`) does to a CPU training run's
memory and time, one run: a short `swerl train` of the SmolLM2 credit-assignment experiment's run config
(scripts/experiment_credit.py, configs/experiment/credit_smollm2_cpu.yaml; the imported model itself as
the policy, no warm start), twice at once on one thread each, as that experiment's `jobs: 2` runs them:
once as swerl runs (the hf engine releases when it has nothing left to decode, the learner after each
update) and once with the release switched off (glibc alone, the baseline).

Reported per setting: wall seconds, peak resident memory (VmHWM), resident memory sampled every 2 s
(mean, and at the end), and the seconds of each phase from the run's metrics.jsonl. The two runs share
the 2 cores, so their times are comparable with each other, not with a run alone.

    .venv/bin/python scripts/bench_heap.py [--steps 2] [--out bench_out/bench_heap.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "experiment" / "credit_smollm2_cpu.yaml"


def child(mode: str, run_dir: Path, steps: int) -> None:
    """One setting, in this process: train, sampling this process's RSS; run_dir/result.json."""
    import yaml

    sys.path.insert(0, str(ROOT / "scripts"))
    from experiment_credit import load_config, train_config

    from swerl.cli import main as swerl_main
    from swerl.models.shipped import resolve_model

    if mode == "glibc":
        import swerl.learner.learner as learner
        import swerl.rollout.hf as hf

        hf.release_free_memory = learner.release_free_memory = lambda: False
    cfg = load_config(str(CONFIG), [f"steps={steps}", f"eval_every={steps}", f"out={run_dir}"])
    model = Path(resolve_model(cfg.model.path))
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "train.yaml"
    path.write_text(yaml.safe_dump(train_config(cfg, "frozenlake", cfg.data[0], "uniform", 0, model),
                                   sort_keys=False))
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(2.0):
            samples.append(_status()["VmRSS"])

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.monotonic()
    code = swerl_main(["train", "--config", str(path), *cfg.train_overrides])
    wall = time.monotonic() - t0
    stop.set()
    if code:
        sys.exit(f"swerl train exited {code}")
    rows = [json.loads(x) for x in next(run_dir.rglob("metrics.jsonl")).read_text().splitlines()]
    phases = {k.removeprefix("timing_s/"): round(sum(r.get(k, 0.0) for r in rows), 1)
              for k in ("timing_s/rollout", "timing_s/learn", "timing_s/eval")}
    status = _status()
    result = {"mode": mode, "wall_s": round(wall, 1), "peak_rss_kib": status["VmHWM"],
              "final_rss_kib": status["VmRSS"], "mean_rss_kib": int(statistics.fmean(samples)),
              "phases_s": phases}
    (run_dir / "result.json").write_text(json.dumps(result))


def _status() -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="RL steps per run (the last one evaluates)")
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_heap.json"))
    ap.add_argument("--child", choices=("release", "glibc"), help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, Path(args.run_dir), args.steps)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="bench_heap_") as tmp:
        logs = {mode: Path(tmp) / f"{mode}.log" for mode in ("release", "glibc")}
        procs = {}
        for mode, log in logs.items():
            with log.open("w") as f:  # a file, not a pipe: nobody reads one run's output while it waits
                procs[mode] = subprocess.Popen([sys.executable, __file__, "--child", mode, "--steps",
                                                str(args.steps), "--run-dir", str(Path(tmp) / mode)],
                                               env=env, text=True, stdout=f, stderr=subprocess.STDOUT)
        runs = []
        try:
            for mode, p in procs.items():
                if p.wait():
                    tail = (logs[mode].read_text().strip().splitlines() or [""])[-1]
                    sys.exit(f"bench_heap: the {mode} run failed: {tail}")
                runs.append(json.loads((Path(tmp) / mode / "result.json").read_text()))
        finally:
            for p in procs.values():
                p.kill()
                p.wait()
    release, glibc = runs
    result = {"config": str(CONFIG.relative_to(ROOT)), "steps": args.steps, "runs": runs,
              "peak_rss_ratio_release_over_glibc": round(release["peak_rss_kib"] / glibc["peak_rss_kib"], 3),
              "mean_rss_ratio_release_over_glibc": round(release["mean_rss_kib"] / glibc["mean_rss_kib"], 3),
              "wall_ratio_release_over_glibc": round(release["wall_s"] / glibc["wall_s"], 3),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"SmolLM2 swerl train, {args.steps} steps, two at once on 1 thread each: free heap "
                    "pages released at phase ends vs glibc alone")
    for c in ("heap", "wall s", "rollout s", "learn s", "eval s", "peak RSS GiB", "mean RSS GiB",
              "final RSS GiB"):
        t.add_column(c, justify="right")
    for r in runs:
        t.add_row(r["mode"], f"{r['wall_s']:.0f}",
                  *(f"{r['phases_s'][k]:.0f}" for k in ("rollout", "learn", "eval")),
                  *(f"{r[k] / 2**20:.2f}" for k in ("peak_rss_kib", "mean_rss_kib", "final_rss_kib")))
    Console().print(t)
    print(f"release / glibc: peak RSS {result['peak_rss_ratio_release_over_glibc']}x, mean RSS "
          f"{result['mean_rss_ratio_release_over_glibc']}x, wall {result['wall_ratio_release_over_glibc']}x")
    from swerl.files import atomic_write

    atomic_write(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
