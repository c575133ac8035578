"""Sandbox harness benchmark (one run, JSON out).

- tool-call round trip of `true`: persistent session vs a `docker exec` per call (p50 / p95)
- acquiring a sandbox: from the warm pool vs a cold create + start
- episodes per second of a scripted 20-call episode at concurrency 1, 4 and 16
- an editor's file write + read of 8 KiB: as the command's user (read_file / write_file) vs Docker's
  archive API as root (the old way, which let an editor write where the user may not)

Targets (issue 2): session p50 <= 5 ms and >= 10x under docker exec; warm acquire p50 <= 20 ms.
Run: .venv/bin/python scripts/bench_sandbox.py [--calls 200] [--out bench_out/bench_sandbox.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.images import build_base_image
from swerl.sandbox.pool import SandboxPool


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ms(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(xs, 0.5) * 1e3, "p95_ms": pct(xs, 0.95) * 1e3, "n": len(xs)}


def bench_round_trip(spec: SandboxSpec, calls: int) -> dict[str, dict[str, float]]:
    with DockerSandbox(spec) as sb:
        for _ in range(10):
            sb.run("true")
        session = []
        for _ in range(calls):
            t = time.perf_counter()
            sb.run("true")
            session.append(time.perf_counter() - t)
        exec_ = []
        for _ in range(max(20, calls // 4)):
            t = time.perf_counter()
            sb.container.exec_run("true")
            exec_.append(time.perf_counter() - t)
    return {"session": ms(session), "docker_exec": ms(exec_)}


def bench_file_io(spec: SandboxSpec, calls: int) -> dict[str, dict[str, float]]:
    import io
    import tarfile

    data = b"x = 1\n" * 1365
    with DockerSandbox(spec) as sb:
        sb.run("mkdir -p /tmp/b")
        as_user = []
        for _ in range(calls):
            t = time.perf_counter()
            sb.write_file("/tmp/b/f.py", data)
            sb.read_file("/tmp/b/f.py")
            as_user.append(time.perf_counter() - t)
        as_root = []
        for _ in range(calls):
            t = time.perf_counter()
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                info = tarfile.TarInfo("f.py")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            sb.container.put_archive("/tmp/b", buf.getvalue())
            stream, _ = sb.container.get_archive("/tmp/b/f.py")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                tar.extractfile(tar.next()).read()
            as_root.append(time.perf_counter() - t)
    return {"as_user": ms(as_user), "archive_as_root": ms(as_root)}


async def bench_acquire(spec: SandboxSpec, n: int) -> dict[str, dict[str, float]]:
    cold = []
    for _ in range(n):
        t = time.perf_counter()
        sb = await asyncio.to_thread(DockerSandbox(spec).start)
        cold.append(time.perf_counter() - t)
        await asyncio.to_thread(sb.close)
    warm = []
    async with SandboxPool(spec, warm=2, max_containers=4) as pool:
        for _ in range(n):
            while pool.warm < 1:  # measure acquire from a ready warm set, as between episodes
                await asyncio.sleep(0.01)
            t = time.perf_counter()
            sb = await pool.acquire()
            warm.append(time.perf_counter() - t)
            await pool.release(sb)
    return {"warm_pool": ms(warm), "cold_create": ms(cold)}


async def scripted_episode(pool: SandboxPool, calls: int) -> None:
    """An agent-shaped episode: look around, edit, run, diff-like reads; 20 tool calls."""
    async with pool.sandbox() as sb:
        script = ["cd /testbed", "echo 'x = 1' > m.py", "cat m.py", "ls -la",
                  "python3 -c 'import m; print(m.x)'", "grep -n x m.py", "sed -i 's/1/2/' m.py", "cat m.py",
                  "wc -l m.py", "pwd"]
        for i in range(calls):
            await asyncio.to_thread(sb.run, script[i % len(script)])


async def bench_episodes(spec: SandboxSpec, concurrency: int, episodes: int, calls: int) -> dict[str, float]:
    async with SandboxPool(spec, warm=min(concurrency, 8), max_containers=concurrency + 2,
                           max_starts=4) as pool:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                await scripted_episode(pool, calls)

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(episodes)))
        wall = time.perf_counter() - t
    return {"concurrency": concurrency, "episodes": episodes, "calls_per_episode": calls,
            "wall_s": wall, "episodes_per_s": episodes / wall, "tool_calls_per_s": episodes * calls / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300, help="round trips measured through the session")
    ap.add_argument("--acquires", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=32, help="episodes per concurrency level")
    ap.add_argument("--out", default="bench_out/bench_sandbox.json")
    args = ap.parse_args()
    console = Console()
    image = build_base_image(log=None)
    spec = SandboxSpec(image=image, memory="512m")

    rt = bench_round_trip(spec, args.calls)
    fio = bench_file_io(spec, max(20, args.calls // 5))
    acq = asyncio.run(bench_acquire(spec, args.acquires))
    eps = [asyncio.run(bench_episodes(spec, c, max(args.episodes, c), 20)) for c in (1, 4, 16)]

    speedup = rt["docker_exec"]["p50_ms"] / rt["session"]["p50_ms"]
    acq_speedup = acq["cold_create"]["p50_ms"] / acq["warm_pool"]["p50_ms"]
    t1 = Table(title="tool-call round trip of `true` and sandbox acquire")
    for col in ("what", "p50 ms", "p95 ms", "n"):
        t1.add_column(col, justify="right" if col != "what" else "left")
    for name, d in (("persistent session", rt["session"]), ("docker exec", rt["docker_exec"]),
                    ("warm pool acquire", acq["warm_pool"]), ("cold create+start", acq["cold_create"]),
                    ("file write+read as the user", fio["as_user"]),
                    ("file write+read, archive API as root", fio["archive_as_root"])):
        t1.add_row(name, f"{d['p50_ms']:.2f}", f"{d['p95_ms']:.2f}", str(d["n"]))
    console.print(t1)
    console.print(f"session vs docker exec: {speedup:.0f}x faster (target >= 10x, p50 <= 5 ms)")
    console.print(f"warm acquire vs cold create: {acq_speedup:.0f}x faster (target p50 <= 20 ms)")
    io_cost = fio["as_user"]["p50_ms"] / fio["archive_as_root"]["p50_ms"]
    console.print(f"file write+read as the user vs as root: {io_cost:.2f}x the time")
    t2 = Table(title="scripted 20-call episodes")
    for col in ("concurrency", "episodes", "wall s", "episodes/s", "tool calls/s"):
        t2.add_column(col, justify="right")
    for e in eps:
        t2.add_row(str(e["concurrency"]), str(e["episodes"]), f"{e['wall_s']:.2f}",
                   f"{e['episodes_per_s']:.2f}", f"{e['tool_calls_per_s']:.0f}")
    console.print(t2)

    result = {
        "round_trip": rt, "acquire": acq, "episodes": eps, "file_io": fio,
        "ratios": {"docker_exec_over_session_p50": speedup, "cold_over_warm_acquire_p50": acq_speedup,
                   "file_io_user_over_root_p50": io_cost},
        "targets_met": {"session_p50_le_5ms": rt["session"]["p50_ms"] <= 5,
                        "session_10x_under_exec": speedup >= 10,
                        "warm_acquire_p50_le_20ms": acq["warm_pool"]["p50_ms"] <= 20},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
