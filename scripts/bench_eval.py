"""Benchmark grading: seconds per graded instance (images cached) and instances per minute at
concurrency 1 and 4. Writes bench_out/bench_eval.json.

    .venv/bin/python scripts/bench_eval.py [--tasks tasks/swe/instances.jsonl] [--n 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from swerl.envs.swe.grading import grade_patch
from swerl.envs.swe.images import resolve_image
from swerl.envs.swe.instances import load_instances


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", default="tasks/swe/instances.jsonl")
    ap.add_argument("--n", type=int, default=8, help="instances graded per concurrency level")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--out", default="bench_out/bench_eval.json")
    args = ap.parse_args()
    instances = load_instances(args.tasks)
    # spread over libraries, so the figure is not one test suite's
    by_lib: dict[str, list] = {}
    for inst in instances:
        by_lib.setdefault(inst.repo, []).append(inst)
    chosen = []
    while len(chosen) < args.n and any(by_lib.values()):
        for lib in sorted(by_lib):
            if by_lib[lib] and len(chosen) < args.n:
                chosen.append(by_lib[lib].pop(0))
    t = time.perf_counter()
    images = {i.instance_id: resolve_image(i) for i in chosen}  # warm: the benchmark measures grading
    warm_s = time.perf_counter() - t
    results = {"instances": [i.instance_id for i in chosen], "image_warmup_s": round(warm_s, 2),
               "cpus": os.cpu_count(), "platform": platform.platform(), "levels": {}}
    for level in (int(x) for x in args.concurrency.split(",")):
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=level) as pool:
            grades = list(pool.map(lambda i: grade_patch(i, i.patch, image=images[i.instance_id]), chosen))
        wall = time.perf_counter() - t
        bad = [g.instance_id for g in grades if not g.resolved]
        per = [g.total_s for g in grades]
        results["levels"][str(level)] = {
            "wall_s": round(wall, 2), "instances_per_min": round(60 * len(chosen) / wall, 2),
            "s_per_instance_mean": round(statistics.mean(per), 2),
            "s_per_instance_median": round(statistics.median(per), 2),
            "start_s_mean": round(statistics.mean(g.start_s for g in grades), 3),
            "apply_s_mean": round(statistics.mean(g.apply_s for g in grades), 3),
            "test_s_mean": round(statistics.mean(g.test_s for g in grades), 3),
            "not_resolved": bad}
        print(f"concurrency {level}: {results['levels'][str(level)]}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
