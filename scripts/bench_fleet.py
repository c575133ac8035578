"""The fleet benchmark (one run, JSON + table): episodes over sandbox hosts of a Ray cluster vs one machine.

On a cluster of this one machine (`swerl.cluster.onebox`: a Ray head, a node per host, a second Docker
daemon for host b):
- overhead through the fleet vs the local runner, per episode and per model turn (tool calls themselves run
  on the host and never cross Ray), from episodes without a sandbox of 1 and 11 turns (targets: <= 50 ms
  per episode, <= 1 ms per turn): with an in-process engine, whose turns go through the bridge to the
  driver; and with an SGLang server (the strict double of tests/rollout/fakes over a tiny model, one token
  a turn), whose turns the hosts send straight to the server (`cluster.generation=direct`) or through the
  bridge (`bridge`), against the driver sending them itself;
- episodes per hour of sandboxed episodes (two `sleep 1` tool calls each) on 1 host vs 2 hosts;
- failover: from a host's node removed mid-run to the fleet marking it lost and to its episodes requeued;
- moving an image to a host: `docker save` + `docker load` of the base image into an empty daemon (with
  `--measure-build`, against building it there by debootstrap);
- the dispatcher alone with 64 stand-in hosts x 32 slots: picks per second (target >= 1,000/s) and the
  spread of episodes over the hosts;
- per-host SLO on this machine's daemon: sandboxes at once with 0 failures (2, 4, 8), boot p50 / p99 cold
  (create + start + shell) and warm (from the pool), containers left.
Ratios are the figures to quote here; absolute times depend on this machine's 2 shared cores.

Run: .venv/bin/python scripts/bench_fleet.py [--episodes 8] [--out bench_out/bench_fleet.json]
(root, Docker and the `ray` extra: pip install -e '.[ray]')
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from swerl.agent import ToolEnv, load_tokenizer
from swerl.agent import tool_call_text as call
from swerl.agent.env import EpisodeSpec
from swerl.agent.format import TOOL_CALL_FORMAT
from swerl.cluster import ClusterConfig, Fleet, HostConfig, RayConfig
from swerl.cluster.onebox import extra_daemon, onebox_cluster
from swerl.cluster.schedule import Scheduler
from swerl.files import atomic_write
from swerl.rollout.runner import run_episodes
from swerl.sandbox import DockerSandbox, lifecycle
from swerl.sandbox.images import build_base_image, save_image
from swerl.sandbox.pool import SandboxPool
from swerl.structs import (
    ChatMessage,
    EnvStart,
    EpisodeLimits,
    Generation,
    ParsedTurn,
    SandboxSpec,
    StepResult,
    ToolSpec,
)

BASH = ToolSpec("bash", "run a command", json.dumps({"type": "object", "properties": {
    "command": {"type": "string"}}, "required": ["command"]}))


class Policy:
    """Every turn the same bash call (a function of nothing: any number of episodes share it)."""

    def __init__(self, tok: Any, command: str) -> None:
        text = call("bash", {"command": command})
        self.ids = [*tok.encode(text, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]

    async def generate(self, prompt_ids: list[int], params: Any) -> Generation:
        return Generation(token_ids=list(self.ids), logprobs=[0.0] * len(self.ids), finish_reason="stop")


class CountEnv:
    """No sandbox: each tool call is answered `ok`; the episode ends after `turns` of them."""

    action_format = TOOL_CALL_FORMAT

    def __init__(self, turns: int) -> None:
        self.turns, self.n = turns, 0

    def reset(self) -> EnvStart:
        return EnvStart(messages=(ChatMessage("user", "call bash"),), tools=(BASH,))

    def step(self, turn: ParsedTurn) -> StepResult:
        self.n += 1
        return StepResult(observation="ok", terminated=self.n >= self.turns, reward=0.0, reason="done")


def specs_nosandbox(n: int, turns: int) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"n{i}", group=i, sample=0, make_env=lambda sb, t=turns: CountEnv(t))
            for i in range(n)]


def specs_sandbox(n: int, image: str) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"s{i}", group=i // 2, sample=i % 2, sandbox=SandboxSpec(image=image),
                        make_env=lambda sb: ToolEnv(sb, "sleep")) for i in range(n)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run(specs: list[EpisodeSpec], engine: Any, tok: Any, *, pools: Any = None, max_episodes: int = 1,
        turns: int = 30) -> tuple[float, list[Any]]:
    t = time.perf_counter()
    res = asyncio.run(run_episodes(specs, engine, tok, pools=pools, max_episodes=max_episodes, progress=False,
                                   limits=EpisodeLimits(max_turns=turns)))
    bad = [r.error for r in res if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed: {bad[0]}")
    return time.perf_counter() - t, res


def fleet_cfg(address: str, url2: str | None) -> ClusterConfig:
    hosts = [HostConfig(name="a", capacity=2)]
    if url2:
        hosts.append(HostConfig(name="b", docker_url=url2, capacity=2))
    return ClusterConfig(backend="ray", ray=RayConfig(address=address), hosts=tuple(hosts), discover=False,
                         heartbeat_s=0.5, reap_interval_s=1.0)


def bench_overhead(box: Any, tok: Any, n: int) -> dict[str, float]:
    engine = Policy(tok, "true")
    out: dict[str, float] = {}
    with Fleet(fleet_cfg(box.address, None), run_id="bench-fleet-overhead", warm=0) as fleet:
        for turns in (1, 11):
            run(specs_nosandbox(2, turns), engine, tok, pools=fleet)  # warm-up (imports, actor start)
            local, _ = run(specs_nosandbox(n, turns), engine, tok)
            remote, _ = run(specs_nosandbox(n, turns), engine, tok, pools=fleet)
            out[f"local_s_per_episode_{turns}"] = local / n
            out[f"fleet_s_per_episode_{turns}"] = remote / n
    d1 = out["fleet_s_per_episode_1"] - out["local_s_per_episode_1"]
    d11 = out["fleet_s_per_episode_11"] - out["local_s_per_episode_11"]
    out["per_turn_ms"] = (d11 - d1) / 10 * 1e3
    out["per_episode_ms"] = (d1 - (d11 - d1) / 10) * 1e3
    return out


def bench_direct(box: Any, tok: Any, n: int) -> dict[str, float]:
    """Per-turn and per-episode cost of each route to an SGLang server, against the local runner."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rollout"))
    from fakes.fake_sglang import FakeSGLangServer

    from swerl.models import make_tiny_qwen
    from swerl.rollout import SGLangEngine
    from swerl.rollout.config import SGLangServerConfig
    from swerl.structs import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=1)  # one token a turn: the route, not the model

    async def episodes(engine: Any, specs: list[EpisodeSpec], turns: int, fleet: Any) -> float:
        t = time.perf_counter()
        res = await run_episodes(specs, engine, tok, pools=fleet, max_episodes=1, progress=False,
                                 limits=EpisodeLimits(max_turns=turns), params=params)
        bad = [r.error for r in res if not r.ok]
        if bad:
            raise RuntimeError(f"{len(bad)} episodes failed: {bad[0]}")
        return time.perf_counter() - t

    out: dict[str, float] = {}

    async def go(url: str) -> None:
        engine = await SGLangEngine.start(SGLangServerConfig(urls=(url,)))
        try:
            for route in ("direct", "bridge"):
                cfg = dataclasses.replace(fleet_cfg(box.address, None), generation=route)
                with Fleet(cfg, run_id=f"bench-fleet-{route}", warm=0) as fleet:
                    for turns in (1, 11):
                        await episodes(engine, specs_nosandbox(2, turns), turns, fleet)  # warm-up
                        local = await episodes(engine, specs_nosandbox(n, turns), turns, None)
                        remote = await episodes(engine, specs_nosandbox(n, turns), turns, fleet)
                        out[f"{route}_local_s_per_episode_{turns}"] = local / n
                        out[f"{route}_fleet_s_per_episode_{turns}"] = remote / n
                    assert dict(fleet.routes) == {route: 2 * (n + 2)}, fleet.routes
        finally:
            await engine.close()

    with tempfile.TemporaryDirectory() as d:
        model = make_tiny_qwen(Path(d) / "tiny", tokenizer=tok)
        with FakeSGLangServer(model, tokenizer=tok, release="0.5.21") as fake:
            asyncio.run(go(fake.url))
    for route in ("direct", "bridge"):
        d1 = out[f"{route}_fleet_s_per_episode_1"] - out[f"{route}_local_s_per_episode_1"]
        d11 = out[f"{route}_fleet_s_per_episode_11"] - out[f"{route}_local_s_per_episode_11"]
        out[f"{route}_per_turn_ms"] = (d11 - d1) / 10 * 1e3
        out[f"{route}_per_episode_ms"] = (d1 - (d11 - d1) / 10) * 1e3
    return out


def bench_throughput(box: Any, url2: str, tok: Any, image: str, n: int) -> dict[str, float]:
    engine = Policy(tok, "sleep 1")
    out = {}
    for hosts, url in ((1, None), (2, url2)):
        with Fleet(fleet_cfg(box.address, url), run_id=f"bench-fleet-tp{hosts}", warm=1) as fleet:
            # first the image copies and the warm pools, then the timed run
            run(specs_sandbox(2, image), engine, tok, pools=fleet, max_episodes=2, turns=1)
            wall, res = run(specs_sandbox(n, image), engine, tok, pools=fleet, max_episodes=2 * hosts,
                            turns=2)
            out[f"episodes_per_hour_{hosts}_host"] = n / wall * 3600
            used = {r.host for r in res}
            if len(used) != hosts:
                raise RuntimeError(f"the {hosts}-host run used hosts {sorted(used)}")
            out[f"hosts_used_{hosts}"] = len(used)
    out["ratio_2_over_1"] = out["episodes_per_hour_2_host"] / out["episodes_per_hour_1_host"]
    return out


def bench_failover(box: Any, url2: str, tok: Any, image: str) -> dict[str, Any]:
    engine = Policy(tok, "sleep 2")
    client2 = __import__("docker").DockerClient(base_url=url2)
    with Fleet(fleet_cfg(box.address, url2), run_id="bench-fleet-failover", warm=0) as fleet:
        got: dict[str, Any] = {}
        th = threading.Thread(target=lambda: got.setdefault("r", run(specs_sandbox(8, image), engine, tok,
                                                                      pools=fleet, max_episodes=4, turns=2)))
        th.start()
        filters = {"label": "swerl.run=bench-fleet-failover"}
        while not client2.containers.list(filters=filters):
            time.sleep(0.1)
        time.sleep(1.0)
        t_remove = fleet.clock()
        box.remove_host("b")
        time.sleep(2.0)
        box.add_host("b")
        th.join()
        ev = fleet.events
        lost = next(e.t for e in ev if e.kind == "host_lost")
        requeued = [e.t for e in ev if e.kind == "requeued"]
        back = next((e.t for e in ev if e.kind == "host_up" and e.t > lost), None)
    client2.close()
    return {"detect_s": lost - t_remove, "requeued_s": (requeued[0] - t_remove) if requeued else None,
            "episodes_requeued": len(requeued),
            "back_after_readd_s": (back - t_remove - 2.0) if back else None,
            "failed": sum(not r.ok for r in got["r"][1])}


def bench_image_copy(client1: Any, url2: str, image: str, measure_build: bool) -> dict[str, float]:
    import docker

    c2 = docker.DockerClient(base_url=url2, timeout=600)
    out: dict[str, float] = {}
    with contextlib.suppress(docker.errors.ImageNotFound):
        c2.images.remove(image, force=True)
    t = time.perf_counter()
    c2.images.load(save_image(client1, image))
    out["save_load_s"] = time.perf_counter() - t
    out["image_mb"] = client1.images.get(image).attrs["Size"] / 1e6
    if measure_build:
        c2.images.remove(image, force=True)
        t = time.perf_counter()
        build_base_image(client=c2, log=None)
        out["build_s"] = time.perf_counter() - t
    c2.close()
    return out


def bench_dispatcher(hosts: int = 64, slots: int = 32, picks: int = 200_000) -> dict[str, float]:
    rng = random.Random(0)
    images = [f"img{i}" for i in range(500)]
    s = Scheduler()
    for h in range(hosts):
        s.add(f"h{h}", slots, set(rng.sample(images, 16)))
    running: list[str] = []
    counts: dict[str, int] = {}
    t = time.perf_counter()
    for _ in range(picks):
        name = s.pick(rng.choice(images))
        if name is None:  # all full: one episode ends, at random
            s.done(running.pop(rng.randrange(len(running))))
            continue
        running.append(name)
        counts[name] = counts.get(name, 0) + 1
    wall = time.perf_counter() - t
    per = list(counts.values())
    return {"hosts": hosts, "slots": slots, "picks_per_s": picks / wall, "episodes_min": min(per),
            "episodes_max": max(per), "episodes_mean": statistics.mean(per),
            "spread_max_over_min": max(per) / min(per)}


async def _slo(spec: SandboxSpec, concurrency: int) -> dict[str, Any]:
    cold: list[float] = []
    failures = 0

    async def one() -> None:
        nonlocal failures
        t = time.perf_counter()
        sb = DockerSandbox(spec, run_id="bench-fleet-slo")
        try:
            await asyncio.to_thread(sb.start)
            cold.append(time.perf_counter() - t)
            for _ in range(5):
                r = await asyncio.to_thread(sb.run, "true")
                failures += r.exit_code != 0
        except Exception:
            failures += 1
        finally:
            await asyncio.to_thread(sb.close)

    await asyncio.gather(*(one() for _ in range(concurrency)))
    warm: list[float] = []
    async with SandboxPool(spec, warm=2, max_containers=4, run_id="bench-fleet-slo") as pool:
        for _ in range(8):
            await asyncio.sleep(1.0)  # the pool refills in the background
            t = time.perf_counter()
            sb = await pool.acquire()
            warm.append(time.perf_counter() - t)
            await pool.release(sb)
    return {"concurrency": concurrency, "failures": failures, "cold_p50_s": pct(cold, 0.5),
            "cold_p99_s": pct(cold, 0.99), "warm_p50_ms": pct(warm, 0.5) * 1e3,
            "warm_p99_ms": pct(warm, 0.99) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=8, help="sandboxed episodes per throughput run")
    ap.add_argument("--overhead-episodes", type=int, default=20)
    ap.add_argument("--measure-build", action="store_true", help="also build the base image on the second "
                                                                   "daemon by debootstrap (minutes)")
    ap.add_argument("--out", default="bench_out/bench_fleet.json")
    args = ap.parse_args()
    console = Console()
    tok = load_tokenizer(None)
    client1 = lifecycle.docker_client()
    image = build_base_image(client=client1, log=None)
    result: dict[str, Any] = {"dispatcher": bench_dispatcher()}
    console.print("dispatcher done")
    result["slo"] = [asyncio.run(_slo(SandboxSpec(image=image), c)) for c in (2, 4, 8)]
    result["slo_leaks"] = len(client1.containers.list(all=True,
                                                      filters={"label": "swerl.run=bench-fleet-slo"}))
    console.print("per-host SLO done")
    with extra_daemon("swerl-bench-docker2", images=[image], source=client1) as url2:
        result["image_copy"] = bench_image_copy(client1, url2, image, args.measure_build)
        with onebox_cluster(["a", "b"]) as box:
            result["overhead"] = bench_overhead(box, tok, args.overhead_episodes)
            result["servers"] = bench_direct(box, tok, args.overhead_episodes)
            console.print("overhead done")
            result["throughput"] = bench_throughput(box, url2, tok, image, args.episodes)
            console.print("throughput done")
            result["failover"] = bench_failover(box, url2, tok, image)
        import docker

        c2 = docker.DockerClient(base_url=url2)
        def ours(client: Any) -> int:
            return sum(c.labels.get("swerl.run", "").startswith("bench-fleet")
                       for c in client.containers.list(all=True, filters={"label": "swerl.managed=1"}))

        time.sleep(3.0)  # a reaper pass
        result["leaks"] = {"daemon1": ours(client1), "daemon2": ours(c2)}
        c2.close()

    t = Table(title="fleet vs one machine")
    t.add_column("measure")
    t.add_column("value", justify="right")
    o, tp, fo, d, ic = (result[k] for k in ("overhead", "throughput", "failover", "dispatcher", "image_copy"))
    sv = result["servers"]
    rows = [
        ("overhead per episode (ms, target <= 50)", f"{o['per_episode_ms']:.1f}"),
        ("overhead per model turn, in-process engine via the bridge (ms)", f"{o['per_turn_ms']:.2f}"),
        ("SGLang server, hosts direct: per turn (ms) / per episode (ms)",
         f"{sv['direct_per_turn_ms']:.2f} / {sv['direct_per_episode_ms']:.1f}"),
        ("SGLang server, via the bridge: per turn (ms) / per episode (ms)",
         f"{sv['bridge_per_turn_ms']:.2f} / {sv['bridge_per_episode_ms']:.1f}"),
        ("tool calls crossing Ray", "0 (run on the host)"),
        ("episodes/hour 2 hosts / 1 host", f"{tp['ratio_2_over_1']:.2f}x"),
        ("host loss seen after (s)", f"{fo['detect_s']:.1f}"),
        ("its episodes requeued after (s)",
         f"{fo['requeued_s']:.1f}" if fo["requeued_s"] is not None else "-"),
        ("episodes requeued / failed", f"{fo['episodes_requeued']} / {fo['failed']}"),
        ("image to a host: save+load (s)", f"{ic['save_load_s']:.1f} ({ic['image_mb']:.0f} MB)"),
        ("image to a host: debootstrap build (s)",
         f"{ic['build_s']:.0f}" if "build_s" in ic else "not measured"),
        (f"dispatcher picks/s ({d['hosts']} hosts x {d['slots']})", f"{d['picks_per_s']:,.0f}"),
        ("dispatcher spread max/min episodes per host", f"{d['spread_max_over_min']:.2f}"),
        *[(f"SLO: {s['concurrency']} sandboxes at once: failures", str(s["failures"]))
          for s in result["slo"]],
        *[(f"SLO: boot cold p50/p99 at {s['concurrency']} (s)",
           f"{s['cold_p50_s']:.2f} / {s['cold_p99_s']:.2f}") for s in result["slo"]],
        ("SLO: boot warm p50/p99 (ms)", f"{result['slo'][0]['warm_p50_ms']:.1f} / "
                                         f"{result['slo'][0]['warm_p99_ms']:.1f}"),
        ("containers left (daemon 1, daemon 2)",
         f"{result['leaks']['daemon1']}, {result['leaks']['daemon2']}"),
    ]
    for r in rows:
        t.add_row(*r)
    console.print(t)
    out = Path(args.out)
    atomic_write(out, json.dumps(result, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
