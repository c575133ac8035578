"""What writing decode steps into spare room of the KV cache (swerl.rollout.kv_cache, the hf engine's
default) buys over transformers' cache, which concatenates every step's keys and values to a copy of the
whole cache: milliseconds per decode step of a batch of B rows with L cached positions, one run, both
caches alternating step for step (so that a busy machine slows both alike), for several (B, L).

    .venv/bin/python scripts/bench_kv_cache.py [--model smollm2-135m-instruct] [--shapes 1x400,24x400,...]
        [--steps 8] [--out bench_out/bench_kv_cache.json]

The decode step is the engine's (`HFEngine._step`: one token per row, the attention mask grown by one, the
cache updated in place or by concatenation); the cached keys and values are random, which costs the same.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from swerl.files import atomic_write
from swerl.models.shipped import resolve_model
from swerl.rollout.kv_cache import grow_in_place

ROOT = Path(__file__).resolve().parents[1]
HEADROOM = 128  # HFEngineConfig.kv_headroom's default


def _cache(model: Any, b: int, n: int, seed: int) -> Any:
    cfg = model.config
    heads, dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    layers = [(torch.randn(b, heads, n, dim, generator=g), torch.randn(b, heads, n, dim, generator=g))
              for _ in range(cfg.num_hidden_layers)]
    return DynamicCache(layers, config=cfg)


def measure(model: Any, b: int, n: int, steps: int) -> dict[str, Any]:
    """Seconds per decode step with each cache, the steps interleaved."""
    caches = {"concatenate": _cache(model, b, n, 0), "in_place": _cache(model, b, n, 0)}
    masks = {k: torch.ones(b, n, dtype=torch.long) for k in caches}
    tok = torch.randint(0, model.config.vocab_size, (b, 1), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {k: [] for k in caches}
    with torch.inference_mode():
        for i in range(steps + 1):  # the first step of each is warm-up
            for kind in caches:
                if kind == "in_place":
                    grow_in_place(caches[kind], HEADROOM)
                masks[kind] = torch.cat([masks[kind], torch.ones(b, 1, dtype=torch.long)], dim=1)
                t = time.perf_counter()
                out = model(input_ids=tok, attention_mask=masks[kind], position_ids=torch.full((b, 1), n + i),
                            cache=caches[kind], use_cache=True)
                caches[kind] = out.cache
                if i:
                    times[kind].append(time.perf_counter() - t)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return {"rows": b, "cached": n, "steps": steps, "ms_per_step": {k: round(v, 2) for k, v in ms.items()},
            "speedup": round(ms["concatenate"] / ms["in_place"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="an HF directory or a shipped model's name")
    ap.add_argument("--shapes", default="1x400,24x400,2x4096,16x1000,32x1000,64x600",
                    help="comma-separated ROWSxCACHED decode batches")
    ap.add_argument("--steps", type=int, default=8, help="timed decode steps per cache and shape (median)")
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "bench_kv_cache.json"))
    args = ap.parse_args()
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) < 1 for s in shapes) or args.steps < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--shapes must be ROWSxCACHED pairs of positive integers and --steps >= 1, got "
                 f"{args.shapes!r} / {args.steps}")
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32).eval()
    rows = [measure(model, b, n, args.steps) for b, n in shapes]

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{args.model}, hf engine decode step: transformers' cache vs in place "
                    f"(headroom {HEADROOM}), {torch.get_num_threads()} threads")
    for c in ("rows", "cached positions", "concatenate ms", "in place ms", "speedup"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["rows"]), str(r["cached"]), f"{r['ms_per_step']['concatenate']:.1f}",
                  f"{r['ms_per_step']['in_place']:.1f}", f"{r['speedup']:.2f}x")
    Console().print(t)
    result = {"model": args.model, "headroom": HEADROOM, "shapes": rows,
              "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                          "torch": torch.__version__},
              "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out)
    atomic_write(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
