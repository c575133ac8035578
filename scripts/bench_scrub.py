"""Scrub benchmark (one run, JSON out): what scrubbing adds to getting an instance's image.

For one shipped instance of every library (and the SWE-bench-layout image the tests build from a shipped
library, with history past base_commit), three timings of `resolve_image`:

- baseline: the unscrubbed image, already built (`scrub=False`: one lookup);
- first: the scrubbed layer built from scratch (its cached copy removed first);
- cached: the scrubbed layer found by its content hash.

Run: .venv/bin/python scripts/bench_scrub.py [--out bench_out/bench_scrub.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "swe"))  # the SWE-bench-layout image builder the tests use


def _timed(fn: object) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()  # type: ignore[operator]
    return time.perf_counter() - t0, out


def main() -> None:
    from swe_fixtures import swebench_layout_instance

    from swerl.envs.swe.images import resolve_image
    from swerl.envs.swe.instances import load_instances
    from swerl.sandbox import lifecycle

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_scrub.json"))
    args = ap.parse_args()
    client = lifecycle.docker_client(timeout=600)
    suite = load_instances(ROOT / "tasks" / "swe")
    firsts = {}
    for inst in suite:
        firsts.setdefault(inst.source, inst)
    cases = [(f"offline {i.instance_id}", i) for i in firsts.values()]
    layout = swebench_layout_instance(client, firsts["toolz-1.2.0.tar.gz"])
    cases.append(("swebench-layout (history past base)", layout))
    rows = []
    for label, inst in cases:
        raw_s, _ = _timed(lambda inst=inst: resolve_image(inst, client=client, scrub=False))
        # now surely built
        raw_s, _ = _timed(lambda inst=inst: resolve_image(inst, client=client, scrub=False))
        tag = resolve_image(inst, client=client)
        client.images.remove(tag, force=True)
        first_s, _ = _timed(lambda inst=inst: resolve_image(inst, client=client))
        cached_s, _ = _timed(lambda inst=inst: resolve_image(inst, client=client))
        rows.append({"image": label, "baseline_s": raw_s, "first_s": first_s, "cached_s": cached_s,
                     "first_over_baseline_s": first_s - raw_s, "cached_over_baseline_s": cached_s - raw_s})
    print(f"{'image':44} {'baseline s':>10} {'scrub first s':>14} {'scrub cached s':>15}")
    for r in rows:
        print(f"{r['image']:44} {r['baseline_s']:10.3f} {r['first_s']:14.2f} {r['cached_s']:15.3f}")
    firsts_s = [r["first_s"] for r in rows]
    cached = [r["cached_s"] for r in rows]
    summary = {"first_mean_s": sum(firsts_s) / len(firsts_s), "cached_mean_s": sum(cached) / len(cached),
               "first_max_s": max(firsts_s)}
    print(f"mean: first build {summary['first_mean_s']:.2f} s, cached {summary['cached_mean_s']:.3f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows,
                               "summary": summary}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
