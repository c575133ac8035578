"""Weight-sync seconds, disk vs memory, on CPU: the tiny model and a 0.5B-shaped random-init Qwen2
(hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864, vocab 151936), with the measured
bandwidth and the extrapolation to the 32B preset (`swerl.models` parameter counts, bf16 weights).

Both paths end with the weights loaded into a receiver model in a *separate process* (a server's
stand-in):
- disk: the learner's `export_hf` (an HF checkpoint written atomically, fsynced), then the receiver
  loads the directory's safetensors into its model (what a server's reload does);
- memory: the learner's `iter_weight_buckets` streamed over a gloo group built as SGLang builds it
  (`swerl.rollout.weight_sync.init_custom_process_group`), one flattened broadcast per bucket, each
  copied into the receiver's model as it comes (what SGLang's `flattened_bucket` load does).

    .venv/bin/python scripts/bench_weight_sync.py [--bucket-mb 512] [--skip-05b]

Prints a table and writes bench_out/bench_weight_sync.json. Importable: `bench_weight_sync()`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
             "intermediate_size": 256},
    "0.5b-shaped": {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                    "intermediate_size": 4864, "vocab_size": 151936},
}


def _receiver(conn: Any, model_dir: str, port: int, group: str) -> None:
    """The server's stand-in: a model of the same architecture that takes weights from disk or from
    the gloo group, timing only its own side of nothing (the learner times the round trip)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from swerl.rollout.weight_sync import init_custom_process_group

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = dict(model.named_parameters(remove_duplicate=False))
    pg = init_custom_process_group("gloo", "127.0.0.1", port, 2, 1, group)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        if msg[0] == "disk":
            with torch.no_grad():
                for f in sorted(Path(msg[1]).glob("*.safetensors")):
                    for name, t in load_file(str(f)).items():
                        if name in params:
                            params[name].copy_(t)
            conn.send("done")
        elif msg[0] == "bucket":  # [(name, dtype, shape)] of one bucket, then its one broadcast
            metas = msg[1]
            empty = [torch.empty(shape, dtype=getattr(torch, d)) for _, d, shape in metas]
            flat = torch.empty(sum(t.numel() * t.element_size() for t in empty), dtype=torch.uint8)
            torch.distributed.broadcast(flat, src=0, group=pg)
            start = 0
            with torch.no_grad():
                for (name, _, _), t in zip(metas, empty, strict=True):
                    n = t.numel() * t.element_size()
                    params[name].copy_(flat[start:start + n].view(t.dtype).reshape(t.shape))
                    start += n
            conn.send("done")


def _one(label: str, shape: dict[str, int], bucket_mb: float, repeats: int, work: Path) -> dict[str, Any]:
    from swerl.learner import AlgoConfig, Learner, OptimConfig
    from swerl.models import make_tiny_qwen
    from swerl.rollout.weight_sync import free_port, init_custom_process_group

    model_dir = make_tiny_qwen(work / f"{label}-init", seed=0, **shape)
    from transformers import AutoModelForCausalLM

    learner = Learner(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), AlgoConfig(),
                      OptimConfig())
    n_params = sum(p.numel() for p in learner.policy.parameters())
    bucket_bytes = int(bucket_mb * (1 << 20))
    port, group = free_port(), f"bench_{label}"
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(child, str(model_dir), port, group), daemon=True)
    proc.start()
    pg = init_custom_process_group("gloo", "127.0.0.1", port, 2, 0, group)
    assert parent.recv() == "ready"
    disk_s, mem_s, sent_bytes, buckets = [], [], 0, 0
    try:
        for _ in range(repeats):
            target = work / f"{label}-weights"
            t0 = time.perf_counter()
            learner.export_hf(target)
            parent.send(("disk", str(target)))
            assert parent.recv() == "done"
            disk_s.append(time.perf_counter() - t0)
            shutil.rmtree(target, ignore_errors=True)

            t0 = time.perf_counter()
            sent_bytes, buckets = 0, 0
            for b in learner.iter_weight_buckets(bucket_bytes):
                parent.send(("bucket", [(n, str(t.dtype).removeprefix("torch."), list(t.shape))
                                        for n, t in zip(b.names, b.tensors, strict=True)]))
                flat = b.flattened()
                torch.distributed.broadcast(flat, src=0, group=pg)
                assert parent.recv() == "done"
                sent_bytes += b.nbytes
                buckets += 1
            mem_s.append(time.perf_counter() - t0)
    finally:
        parent.send(("exit",))
        proc.join(30)
        torch.distributed.destroy_process_group(pg)
    disk, mem = min(disk_s), min(mem_s)
    return {"model": label, "params": n_params, "bytes": sent_bytes, "buckets": buckets,
            "bucket_mb": bucket_mb,
            "disk_s": disk, "memory_s": mem, "disk_gbps": sent_bytes / disk / 1e9,
            "memory_gbps": sent_bytes / mem / 1e9, "repeats": repeats}


def bench_weight_sync(*, bucket_mb: float = 512.0, repeats: int = 2, skip_05b: bool = False,
                      out: Path | None = ROOT / "bench_out" / "bench_weight_sync.json") -> dict[str, Any]:
    """Run the benchmark (see the module docstring); returns (and writes to `out`) its JSON."""
    from swerl.models import parameter_count

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_weight_sync_") as tmp:
        for label, shape in SHAPES.items():
            if skip_05b and label != "tiny":
                continue
            rows.append(_one(label, shape, bucket_mb, repeats, Path(tmp)))
    big = rows[-1]
    params_32b = float(parameter_count("qwen2.5-32b"))
    bytes_32b = params_32b * 2  # bf16, what the 32B config serves
    extrapolation = {"params": params_32b, "bytes_bf16": bytes_32b,
                     "disk_s": bytes_32b / (big["disk_gbps"] * 1e9),
                     "memory_s_cpu_gloo": bytes_32b / (big["memory_gbps"] * 1e9),
                     "from": big["model"]}
    result = {"rows": rows, "extrapolation_32b": extrapolation, "cpu_threads": torch.get_num_threads(),
              "note": "CPU, gloo over loopback, one receiver process; the GPU path (NCCL) is not "
                      "measured here"}
    print(f"{'model':<12} {'params':>12} {'buckets':>7} {'disk s':>8} {'memory s':>9} {'disk GB/s':>9} "
          f"{'mem GB/s':>9}")
    for r in rows:
        print(f"{r['model']:<12} {r['params']:>12,} {r['buckets']:>7} {r['disk_s']:>8.3f} "
              f"{r['memory_s']:>9.3f} {r['disk_gbps']:>9.3f} {r['memory_gbps']:>9.3f}")
    print(f"32B extrapolation ({params_32b / 1e9:.2f}B params, bf16 {bytes_32b / 2**30:.1f} GiB) from "
          f"{big['model']}: disk {extrapolation['disk_s']:.0f} s, memory (CPU gloo) "
          f"{extrapolation['memory_s_cpu_gloo']:.0f} s per sync")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bucket-mb", type=float, default=512.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-05b", action="store_true", help="the tiny model only")
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bench_weight_sync(bucket_mb=a.bucket_mb, repeats=a.repeats, skip_05b=a.skip_05b)


if __name__ == "__main__":
    main()
