"""Episodes over two sandbox hosts of a Ray cluster on one machine (`conftest.py`: a head, nodes `a` and
`b`, two real Docker daemons): the spread, a host lost mid-run and coming back, a node joining, a killed
driver, and bad input refused before any work. One cluster serves the module."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fleet_helpers import DAEMON2, SleepPolicy, fleet_cfg, specs

from swerl.cluster import ClusterConfig, Fleet, FleetError, HostConfig, RayConfig
from swerl.rollout.runner import run_episodes
from swerl.structs import EpisodeLimits, SamplingParams

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow]


def run(fleet, tok, n, image, *, turns=2, sleep_s=1.0, max_episodes=4):
    return asyncio.run(run_episodes(specs(n, image), SleepPolicy(tok, sleep_s), tok, pools=fleet,
                                    max_episodes=max_episodes, progress=False,
                                    limits=EpisodeLimits(max_turns=turns)))


def containers(client, run_id) -> int:
    # the low-level list inspects nothing, so a container removed meanwhile is no error
    return len(client.api.containers(all=True, filters={"label": f"swerl.run={run_id}"}))


def wait_clean(clients, run_id, within_s=15.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while True:
        left = [containers(c, run_id) for c in clients]
        if not any(left) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_the_second_daemon_leaves_the_first_daemons_network_alone(daemon2, docker_client, base_image):
    # dockerd --bridge=none deletes docker0: the first daemon's containers on its default network then fail
    c = docker_client.containers.run(base_image, ["true"], detach=True, network_mode="bridge",
                                     labels={"swerl.run": os.environ["SWERL_RUN_ID"]})
    try:
        assert c.wait(timeout=60)["StatusCode"] == 0
    finally:
        c.remove(force=True)


def test_episodes_spread_over_both_hosts_and_run_in_their_daemons(cluster, daemon2, docker_client, tok,
                                                                   base_image):
    run_id = "pytest-fleet-spread"
    seen = {"a": 0, "b": 0}
    with Fleet(fleet_cfg(cluster), run_id=run_id, warm=1) as fleet:
        assert fleet.hosts_up() == ["a", "b"]

        def watch():  # while the episodes run, each daemon holds sandboxes of the run
            for _ in range(40):
                seen["a"] = max(seen["a"], containers(docker_client, run_id))
                seen["b"] = max(seen["b"], containers(daemon2, run_id))
                time.sleep(0.25)

        w = threading.Thread(target=watch)
        w.start()
        results = run(fleet, tok, 8, base_image)
        w.join()
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        by_host = {h: sum(r.host == h for r in results) for h in ("a", "b")}
        print("episodes per host:", by_host)
        # 4 at once over 2 + 2 slots: both hosts take turns, none idles
        assert by_host["a"] >= 2 and by_host["b"] >= 2 and sum(by_host.values()) == 8
        assert dict(fleet.episodes) == by_host
        # the tool calls ran in containers on the host's own daemon
        assert seen["a"] >= 1 and seen["b"] >= 1, seen
        assert all(r.trajectory.num_tool_calls == 2 for r in results)
    assert wait_clean([docker_client, daemon2], run_id) == [0, 0]


class BarrierPolicy:
    """The first turn a bash call that prints the time, sleeps `sleep_s` and prints the time again, handed
    out only once all `n` first turns have been asked for, so the episodes reach their tool calls
    together; the next turn's call returns at once."""

    def __init__(self, tok, n: int, sleep_s: float) -> None:
        self.tok, self.n, self.sleep_s = tok, n, sleep_s
        self.asked = 0
        self.all_asked: asyncio.Event | None = None

    async def generate(self, prompt_ids, params):
        from swerl.agent import tool_call_text
        from swerl.structs import Generation

        if self.all_asked is None:
            self.all_asked = asyncio.Event()
        self.asked += 1
        if self.asked >= self.n:
            self.all_asked.set()
        await asyncio.wait_for(self.all_asked.wait(), 120)
        command = f"echo T0=$(date +%s.%N); sleep {self.sleep_s}; echo T1=$(date +%s.%N)"
        # the second turn (its prompt holds the first call's output) returns at once
        call = tool_call_text("bash", {"command": command if self.asked <= self.n else "true"})
        ids = [*self.tok.encode(call, add_special_tokens=False),
               self.tok.convert_tokens_to_ids("<|im_end|>")]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def test_a_host_with_all_its_sandboxes_in_tool_calls_runs_them_at_once_and_answers_heartbeats(
        cluster, daemon2, docker_client, tok, base_image):
    """Host a, capacity 8, 8 episodes that reach their 8 s tool calls together: all 8 are in their call at
    once (the host's worker threads are sized to its capacity; an actor's own pool has min(32, cores + 4))
    and its heartbeats go on meanwhile (it probes its daemon in a thread of its own): it is never marked
    lost, nothing is requeued."""
    import re

    run_id = "pytest-fleet-busy"
    n = 8
    cfg = dataclasses.replace(fleet_cfg(cluster, hosts=(HostConfig(name="a", capacity=n),), discover=False),
                              heartbeat_s=1.0)
    with Fleet(cfg, run_id=run_id, warm=0) as fleet:
        results = asyncio.run(run_episodes(specs(n, base_image), BarrierPolicy(tok, n, 8), tok, pools=fleet,
                                           max_episodes=n, progress=False, limits=EpisodeLimits(max_turns=2)))
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        assert [e.kind for e in fleet.events] == ["host_up"], [(e.kind, e.detail) for e in fleet.events]
        text = [tok.decode(r.trajectory.token_ids) for r in results]
        t0 = [float(re.search(r"T0=(\d+\.\d+)", t).group(1)) for t in text]
        t1 = [float(re.search(r"T1=(\d+\.\d+)", t).group(1)) for t in text]
        assert max(t0) < min(t1), sorted(zip(t0, t1, strict=True))  # one moment when all 8 were running
    assert wait_clean([docker_client], run_id) == [0]


def test_a_host_lost_mid_run_requeues_its_episodes_and_gets_work_when_back(cluster, daemon2, docker_client,
                                                                         tok, base_image):
    run_id = "pytest-fleet-failover"
    with Fleet(fleet_cfg(cluster), run_id=run_id, warm=1) as fleet:
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", run(fleet, tok, 12, base_image, sleep_s=1.5)))
        t0 = time.monotonic()
        t.start()
        while not containers(daemon2, run_id) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        time.sleep(1.0)  # b's episodes are mid-tool-call
        cluster.remove_host("b")
        removed = fleet.clock()
        time.sleep(2.0)
        cluster.add_host("b")  # the node comes back with the same resource: the host restarts there
        t.join(timeout=180)
        results = out["r"]
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]  # requeued, not failed
        ev = [(e.kind, e.host) for e in fleet.events]
        lost_at = next(e.t for e in fleet.events if e.kind == "host_lost")
        print("timeline:", [(e.t, e.kind, e.host, e.detail[:60]) for e in fleet.events],
              f"node removed at {removed:.1f} s")
        assert ("host_lost", "b") in ev and ("requeued", "b") in ev
        assert lost_at - removed < 5.0  # seen within seconds
        assert ev.index(("host_up", "b"), ev.index(("host_lost", "b"))) > 0  # and back
        # the host that came back takes episodes again
        again = run(fleet, tok, 4, base_image, turns=1)
        assert {r.host for r in again} == {"a", "b"}
    # the lost incarnation's sandboxes on b are removed by b's reaper (their owner process is gone)
    assert wait_clean([docker_client, daemon2], run_id) == [0, 0]


def test_a_node_that_joins_mid_run_becomes_a_host_and_gets_episodes(cluster, daemon2, docker_client, tok,
                                                                   base_image):
    run_id = "pytest-fleet-join"
    hosts = (HostConfig(name="a", capacity=1), HostConfig(name="b", docker_url=DAEMON2, capacity=1))
    with Fleet(fleet_cfg(cluster, hosts=hosts), run_id=run_id, warm=0) as fleet:  # c: found on the cluster
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", run(fleet, tok, 8, base_image, turns=2,
                                                                   max_episodes=3)))
        t.start()
        time.sleep(2.0)
        cluster.add_host("c")
        t.join(timeout=180)
        results = out["r"]
        assert all(r.ok for r in results)
        assert ("host_up", "c") in [(e.kind, e.host) for e in fleet.events]
        assert any(r.host == "c" for r in results), [r.host for r in results]
    # with discovery off, a fleet uses only the hosts its config names
    with Fleet(fleet_cfg(cluster, discover=False), run_id=run_id, warm=0) as only:
        assert only.hosts_up() == ["a", "b"]
    cluster.remove_host("c")
    assert wait_clean([docker_client, daemon2], run_id) == [0, 0]


DRIVER = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[3])
    from fleet_helpers import SleepPolicy, fleet_cfg, specs
    from swerl.agent import load_tokenizer
    from swerl.cluster import Fleet
    from swerl.rollout.runner import run_episodes
    from swerl.structs import EpisodeLimits

    class C:
        address = sys.argv[1]

    tok = load_tokenizer(None)
    with Fleet(fleet_cfg(C), run_id=sys.argv[2], warm=0) as fleet:
        print("up", flush=True)
        asyncio.run(run_episodes(specs(4, "swerl-base:latest"), SleepPolicy(tok, 60), tok, pools=fleet,
                                 max_episodes=4, progress=False, limits=EpisodeLimits(max_turns=1)))
""")


def test_a_killed_driver_leaves_no_container_on_any_host(cluster, daemon2, docker_client, base_image):
    run_id = "pytest-fleet-killed"
    here = os.path.dirname(__file__)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address, run_id, here],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 60
        while (containers(docker_client, run_id) < 2 or containers(daemon2, run_id) < 2) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        assert containers(docker_client, run_id) == 2 and containers(daemon2, run_id) == 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs in the driver, nor in its actors (Ray kills them)
        proc.wait()
    t0 = time.monotonic()
    assert wait_clean([docker_client, daemon2], run_id, within_s=20) == [0, 0]
    print(f"containers gone {time.monotonic() - t0:.1f} s after the driver's SIGKILL")


def test_bad_input_is_one_line_before_any_work(cluster, tok):
    with pytest.raises(FleetError, match=r"^cannot reach the Ray cluster at cluster.ray.address='127.0"):
        Fleet(ClusterConfig(backend="ray", ray=RayConfig(address="127.0.0.1:9")), run_id="x").__enter__()
    bad = [
        ((HostConfig(name="zz"),), r"^cluster.hosts: no Ray node offers resource swerl_host_zz — start"),
        ((HostConfig(name="b", docker_url="unix:///run/swerl-no-such.sock"),),
         r"^host b: its Docker daemon does not answer \(.*\) — start dockerd on that node"),
    ]
    for hosts, message in bad:
        with pytest.raises(FleetError, match=message) as e, \
                Fleet(fleet_cfg(cluster, hosts=hosts), run_id="pytest-fleet-bad"):
            pass
        assert "\n" not in str(e.value)


def test_a_swe_debug_run_trains_on_episodes_from_both_hosts(cluster, daemon2, docker_client, tmp_path):
    """`swerl train`'s debug run (SWE tasks, SWE-bench-graded rewards, hf engine) with cluster.backend=ray:
    the step's episodes ran on both hosts (graded on the host's own daemon; the task image copied to b),
    none failed, the learner updated, and training's evaluation went through the fleet too."""
    import dataclasses
    import json

    from swerl.config import load
    from swerl.train import TrainConfig, train

    cfg = load(TrainConfig, "configs/debug_cpu.yaml", [
        f"run_dir={tmp_path}", "steps=1", "rollout.max_new_tokens=16", "rollout.max_turns=2",
        "rollout.max_episodes=4", "export_final=false"])
    cfg = dataclasses.replace(cfg, cluster=fleet_cfg(cluster))
    rows = train(cfg, log=print)
    r = rows[0]
    print({k: v for k, v in r.items() if k.startswith("rollout/host/")})
    assert r["rollout/episodes_run"] == 4 and r["rollout/episodes_failed"] == 0 and not r["actor/skipped"]
    assert r["rollout/host/a"] >= 1 and r["rollout/host/b"] >= 1
    assert r["rollout/host/a"] + r["rollout/host/b"] == 4
    hosts = [json.loads(line)["host"] for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(hosts) == sorted(["a"] * r["rollout/host/a"] + ["b"] * r["rollout/host/b"])
    assert r["val/episodes"] == 1 and r["val/failed"] == 0  # the held-out task, on a host as well
    assert wait_clean([docker_client, daemon2], os.environ["SWERL_RUN_ID"]) == [0, 0]


def test_hosts_generate_straight_from_the_inference_servers(cluster, daemon2, docker_client, tok, base_image,
                                                            tmp_path):
    """An SGLang engine (the strict double): with cluster.generation auto each host attaches a client of its
    own to the driver's workers and generates there (the driver's engine answers none of the turns); with
    bridge every turn goes through the driver's engine. Same episodes either way."""
    from fakes.fake_sglang import FakeSGLangServer

    from swerl.models import make_tiny_qwen
    from swerl.rollout import SGLangEngine
    from swerl.rollout.config import SGLangServerConfig

    model = make_tiny_qwen(tmp_path / "tiny", tokenizer=tok)
    run_id = "pytest-fleet-direct"
    with FakeSGLangServer(model, tokenizer=tok, release="0.5.21") as fake:
        def episodes(generation):
            async def go():
                engine = await SGLangEngine.start(SGLangServerConfig(urls=(fake.url,)))
                try:
                    with Fleet(fleet_cfg(cluster, generation=generation), run_id=run_id, warm=1) as fleet:
                        got = await run_episodes(
                            specs(4, base_image), engine, tok, pools=fleet, max_episodes=4, progress=False,
                            limits=EpisodeLimits(max_turns=2),
                            params=SamplingParams(temperature=1.0, max_new_tokens=8))
                        return got, dict(fleet.routes), engine.generations
                finally:
                    await engine.close()
            before = fake.paths().count("/generate")
            results, routes, driver_turns = asyncio.run(go())
            return results, routes, driver_turns, fake.paths().count("/generate") - before

        results, routes, driver_turns, served = episodes("auto")
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        turns = sum(r.trajectory.num_turns for r in results)
        assert routes == {"direct": 4} and driver_turns == 0 and served == turns > 0
        assert {r.host for r in results} == {"a", "b"}
        results, routes, driver_turns, served = episodes("bridge")
        assert all(r.ok for r in results)
        turns = sum(r.trajectory.num_turns for r in results)
        assert routes == {"bridge": 4} and driver_turns == served == turns > 0
    assert wait_clean([docker_client, daemon2], run_id) == [0, 0]


def test_servers_on_the_drivers_loopback_are_reached_only_from_its_machine():
    """Which hosts generate directly (no Ray needed): a loopback server only from a host on the driver's
    machine; elsewhere auto falls back to the bridge and direct is a one-line error; servers on an address
    the hosts reach go direct from anywhere."""
    from swerl.cluster.fleet import _Host
    from swerl.cluster.host import EpisodeOptions, HostInfo
    from swerl.rollout.config import SGLangServerConfig

    def host(ip):
        return _Host("h", None, None, info=HostInfo("h", "n", 1, 2, 2, 0, (), ip, True))

    def route(generation, url, ip):
        fleet = Fleet(ClusterConfig(backend="ray", generation=generation), run_id="x")
        fleet._ip = "10.0.0.1"
        opts = EpisodeOptions(SamplingParams(), EpisodeLimits(), None, 1, None,
                              servers=SGLangServerConfig(urls=(url,)))
        return fleet._route(host(ip), opts).servers

    loop, lan = "http://127.0.0.1:30000", "http://10.0.0.9:30000"
    assert route("auto", loop, "10.0.0.1") is not None  # the driver's machine
    assert route("auto", loop, "10.0.0.2") is None  # elsewhere: the bridge
    assert route("auto", lan, "10.0.0.2") is not None
    want = (r"^cluster.generation=direct: host h \(10\.0\.0\.2\) cannot reach the server at "
            r"http://127\.0\.0\.1:30000 on the driver's loopback")
    with pytest.raises(FleetError, match=want) as e:
        route("direct", loop, "10.0.0.2")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"cluster.generation must be one of"):
        ClusterConfig(generation="fast")


def test_swerl_eval_runs_its_episodes_on_the_cluster(cluster, daemon2, tmp_path):
    """`swerl eval game ... --ray-address`: the held-out games' episodes run on the cluster's sandbox hosts
    (the expert wins every one, as on one machine); a cluster that does not answer is one line."""
    cmd = [str(Path(sys.executable).parent / "swerl"), "eval", "game", "frozenlake", "--expert",
           "--in-process", "--limit", "6", "--workers", "4", "--out", str(tmp_path / "ev")]
    r = subprocess.run([*cmd, "--ray-address", cluster.address], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "fleet: host_up a" in r.stdout and "fleet: host_up b" in r.stdout
    assert "success 100.0% (6/6)" in r.stdout
    import json

    hosts = [json.loads(f.read_text())["host"] for f in (tmp_path / "ev" / "samples").iterdir()]
    assert sorted(set(hosts)) == ["a", "b"] and len(hosts) == 6  # each sample says where it ran
    bad = subprocess.run([*cmd, "--ray-address", "127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("swerl: error: cannot reach the Ray cluster at cluster.ray.address=")
    assert len(bad.stderr.strip().splitlines()) == 1
