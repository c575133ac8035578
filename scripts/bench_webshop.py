"""Benchmarks of the WebShop text environment.

1. Steps per second of the scripted expert on the shipped catalog: the in-process game vs the same
   game inside a sandbox container behind the text-game server (ratio = sandboxed / in-process).
2. Search latency and index build time against catalog size (generated catalogs of 125 to 10,000
   products; queries are the goals' instructions).

Prints a table and writes bench_out/bench_webshop.json.

Usage:
    python scripts/bench_webshop.py                 # about a minute on 2 cores (needs Docker for part 1b)
    python scripts/bench_webshop.py --no-sandbox    # in-process only
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swerl.envs.webshop import WebShopExpert, WebShopGame  # noqa: E402
from swerl.envs.webshop.data import load_catalog  # noqa: E402
from swerl.envs.webshop.expert import goal_query  # noqa: E402
from swerl.envs.webshop.generator import generate_catalog  # noqa: E402
from swerl.envs.webshop.search import SearchEngine  # noqa: E402

CATALOG = str(ROOT / "tasks" / "webshop")


def expert_steps(game, catalog, goal_ids: list[str]) -> tuple[int, float, list[float]]:
    """Play the expert on each goal; (steps, seconds, scores)."""
    steps, scores = 0, []
    t0 = time.perf_counter()
    for gid in goal_ids:
        obs = game.reset(gid)
        expert = WebShopExpert(catalog.goal(gid))
        while not obs.done:
            obs = game.step(expert.act(obs))
            steps += 1
        scores.append(obs.reward)
    return steps, time.perf_counter() - t0, scores


def bench_steps(n_goals: int, sandbox: bool) -> dict:
    catalog = load_catalog(CATALOG)
    ids = catalog.goal_ids("test")[:n_goals]
    out: dict = {"goals": len(ids)}
    game = WebShopGame(CATALOG)
    steps, secs, scores = expert_steps(game, catalog, ids)
    out["in_process"] = {"steps": steps, "seconds": secs, "steps_per_s": steps / secs,
                         "mean_score": statistics.fmean(scores)}
    if sandbox:
        from swerl.envs.textgame.client import SandboxTextGame
        from swerl.envs.textgame.image import build_textgame_image
        from swerl.sandbox import DockerSandbox
        from swerl.structs import SandboxSpec

        image = build_textgame_image(log=print)
        t0 = time.perf_counter()
        with DockerSandbox(SandboxSpec(image=image)) as sb, \
                SandboxTextGame(sb, "webshop", catalog_dir="tasks/webshop") as sgame:
            start = time.perf_counter() - t0
            steps, secs, scores = expert_steps(sgame, catalog, ids)
        out["sandboxed"] = {"steps": steps, "seconds": secs, "steps_per_s": steps / secs,
                            "mean_score": statistics.fmean(scores), "startup_s": start}
        out["ratio_sandboxed_over_in_process"] = (out["sandboxed"]["steps_per_s"]
                                                  / out["in_process"]["steps_per_s"])
    return out


def bench_search(sizes: list[int], queries: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for per_type in sizes:
            d = generate_catalog(Path(tmp) / str(per_type), seed=0, products_per_type=per_type,
                                 test_goals=min(100, per_type * 25 - 1))
            cat = load_catalog(d)
            t0 = time.perf_counter()
            engine = SearchEngine(cat.products)
            build = time.perf_counter() - t0
            qs = [goal_query(g) for g in cat.goals[:queries]]
            t0 = time.perf_counter()
            hits = [engine.search(q) for q in qs]
            per_query = (time.perf_counter() - t0) / len(qs)
            found = sum(g.asin in [p.asin for p in h[:10]] for g, h in zip(cat.goals, hits, strict=False))
            rows.append({"products": len(cat.products), "index_build_s": build, "search_ms": per_query * 1000,
                         "goal_on_first_page": found / len(qs)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goals", type=int, default=50, help="held-out goals the expert plays in each mode")
    ap.add_argument("--sizes", default="5,22,100,400",
                    help="products per type (x25 products) for the search table")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--no-sandbox", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_webshop.json"))
    args = ap.parse_args()

    steps = bench_steps(args.goals, sandbox=not args.no_sandbox)
    search = bench_search([int(s) for s in args.sizes.split(",")], args.queries)
    print(f"expert on {steps['goals']} held-out goals")
    print(f"{'mode':<12} {'steps':>6} {'steps/s':>10} {'mean score':>11}")
    for mode in ("in_process", "sandboxed"):
        if mode in steps:
            r = steps[mode]
            print(f"{mode:<12} {r['steps']:>6} {r['steps_per_s']:>10.1f} {r['mean_score']:>11.3f}")
    if "ratio_sandboxed_over_in_process" in steps:
        print(f"sandboxed / in-process steps/s: {steps['ratio_sandboxed_over_in_process']:.4f} "
              f"(container start {steps['sandboxed']['startup_s']:.2f} s)")
    print(f"\n{'products':>9} {'index s':>9} {'search ms':>10} {'goal on page 1':>15}")
    for r in search:
        print(f"{r['products']:>9} {r['index_build_s']:>9.3f} {r['search_ms']:>10.3f} "
              f"{r['goal_on_first_page']:>15.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "steps": steps, "search": search}, indent=2) + "\n")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
