"""Warm sandboxes kept across training steps (`SandboxPools` under the episode runner), on the real
Docker engine: every step runs in its own `asyncio.run`, as `swerl train` does; the sandboxes made
ahead survive from one step to the next, the container count stays under its bound with several
images, and nothing of the run is left once the pools are closed (normally, on an exception, on
SIGTERM)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import docker.errors
import pytest

from swerl.agent import ToolEnv, tool_call_text
from swerl.rollout import EpisodeSpec, run_episodes
from swerl.sandbox import SandboxSpec
from swerl.sandbox.pool import SandboxPools
from swerl.structs import EpisodeLimits, Generation, SamplingParams

pytestmark = pytest.mark.docker
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BashPolicy:
    """A scripted policy: every turn is the same bash call (the episode ends at its turn limit)."""

    def __init__(self, tok, command: str) -> None:
        text = tool_call_text("bash", {"command": command})
        self.ids = (*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        await asyncio.sleep(0.01)
        return Generation(self.ids, tuple([-0.5] * len(self.ids)), "stop")


def _containers(client, run_id):
    return client.api.containers(all=True, filters={"label": f"swerl.run={run_id}"})


class Peak:
    """The most containers of a run that the Docker daemon listed at once, polled in a thread."""

    def __init__(self, client, run_id) -> None:
        self.client, self.run_id, self.most = client, run_id, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, len(_containers(self.client, self.run_id)))
            time.sleep(0.02)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _specs(sandbox_specs, used: list[str], *, per_spec: int):
    def make(sb):
        used.append(sb.id)
        return ToolEnv(sb, "Look around.")

    return [EpisodeSpec(f"task-{g}", g, s, make, spec) for g, spec in enumerate(sandbox_specs)
            for s in range(per_spec)]


def _wait_warm(pools: SandboxPools, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while pools.warm < n:
        assert time.monotonic() < deadline, f"pools made {pools.warm} of {n} sandboxes ahead"
        time.sleep(0.05)


def test_warm_sandboxes_survive_from_one_step_to_the_next(tok, base_image, docker_client):
    run_id = f"pytest-warm-{uuid.uuid4().hex[:6]}"
    spec = SandboxSpec(image=base_image, memory="256m")
    policy = BashPolicy(tok, "sleep 0.2; echo hi")
    limits = EpisodeLimits(max_turns=2)
    max_episodes, warm = 2, 2
    used1: list[str] = []
    used2: list[str] = []

    def step(specs):  # one training step: its own event loop, like swerl train's asyncio.run per step
        return asyncio.run(run_episodes(specs, policy, tok, limits=limits, max_episodes=max_episodes,
                                        pools=pools, progress=False))

    with Peak(docker_client, run_id) as peak, \
            SandboxPools(warm=warm, max_containers=max_episodes + warm, run_id=run_id) as pools:
        first = step(_specs([spec], used1, per_spec=6))
        assert all(r.ok for r in first), [r.error for r in first]
        # between steps (no event loop of the caller runs: the learner's turn) the next step's
        # sandboxes are made, for the image the last step used
        _wait_warm(pools, warm)
        ready = {c["Id"] for c in _containers(docker_client, run_id)}
        assert len(ready) == warm
        second = step(_specs([spec], used2, per_spec=6))
        assert all(r.ok for r in second), [r.error for r in second]
        # the first wave of the second step started in those: created before the step, acquired at once
        assert set(used2[:warm]) == ready
        assert all(r.stats.sandbox_acquire_s < 0.1 for r in second[:warm]), [r.stats for r in second[:warm]]
        # a sandbox is never reused: every episode had its own container
        assert len(set(used1 + used2)) == len(used1 + used2) == 12
        assert pools.live <= max_episodes + warm
    assert peak.most <= max_episodes + warm
    # leaving the pools removed everything, including what was made ahead after the last step
    assert not _containers(docker_client, run_id)


def test_many_images_stay_under_one_bound_and_unneeded_pools_close(tok, base_image, docker_client):
    """Three 'images' (specs differing in their memory limit, so they get a pool each): the total
    count stays under max_episodes + warm, and a step that no longer needs an image closes its pool."""
    run_id = f"pytest-warm-many-{uuid.uuid4().hex[:6]}"
    a, b, c = (SandboxSpec(image=base_image, memory=m) for m in ("256m", "272m", "288m"))
    policy = BashPolicy(tok, "echo hi")
    max_episodes, warm = 3, 2
    used: list[str] = []

    def memory_of(cid):
        try:
            return docker_client.api.inspect_container(cid)["HostConfig"]["Memory"]
        except docker.errors.NotFound:  # removed between the listing and the look
            return None

    with Peak(docker_client, run_id) as peak, \
            SandboxPools(warm=warm, max_containers=max_episodes + warm, run_id=run_id) as pools:
        got = asyncio.run(run_episodes(_specs([a, b, a, b], used, per_spec=3), policy, tok, pools=pools,
                                       max_episodes=max_episodes, limits=EpisodeLimits(max_turns=1),
                                       progress=False))
        assert all(r.ok for r in got), [r.error for r in got]
        _wait_warm(pools, warm)  # made for the images the step used most
        got = asyncio.run(run_episodes(_specs([b, c, c], used, per_spec=3), policy, tok, pools=pools,
                                       max_episodes=max_episodes, limits=EpisodeLimits(max_turns=1),
                                       progress=False))
        assert all(r.ok for r in got), [r.error for r in got]
        assert a not in pools._pools  # image a is no longer used: its pool, and what it had made ahead, went
        # made ahead now: for b, which both steps used; not for c, new in this step (SWE tasks drawn anew)
        _wait_warm(pools, warm)
        deadline = time.monotonic() + 30
        while sorted(memory_of(x["Id"]) for x in _containers(docker_client, run_id)) != [272 * 2**20] * warm:
            assert time.monotonic() < deadline, [memory_of(x["Id"])
                                                 for x in _containers(docker_client, run_id)]
            time.sleep(0.05)
        assert len(set(used)) == len(used) == 21
    assert peak.most <= max_episodes + warm
    assert not _containers(docker_client, run_id)


def test_an_exception_in_the_with_block_removes_every_container(base_image, docker_client):
    run_id = f"pytest-warm-exc-{uuid.uuid4().hex[:6]}"
    spec = SandboxSpec(image=base_image, memory="256m")

    async def hold_one(pools):
        await pools.begin([spec] * 3)  # a run of three episodes, cut short after the first acquire
        sb = await pools.acquire(spec)
        await pools.end()  # warm for the next run, which never comes
        return sb

    with pytest.raises(ZeroDivisionError), SandboxPools(warm=2, max_containers=3, run_id=run_id) as pools:
        held = asyncio.run(hold_one(pools))  # acquired and never released: an episode cut short
        _wait_warm(pools, 2)
        assert len(_containers(docker_client, run_id)) == 3 and held.run("echo ok").output == "ok\n"
        raise ZeroDivisionError("the training step failed")
    assert not _containers(docker_client, run_id)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(pools.acquire(spec))


_TRAINER = """
import asyncio, sys, time
from swerl.sandbox import SandboxSpec
from swerl.sandbox.pool import SandboxPools

spec = SandboxSpec(image=sys.argv[1], memory="256m")

async def step(pools):
    await pools.begin([spec] * 4)
    for _ in range(4):
        await pools.release(await pools.acquire(spec))
    await pools.end()

with SandboxPools(warm=2, max_containers=3, run_id=sys.argv[2]) as pools:
    asyncio.run(step(pools))
    deadline = time.monotonic() + 60
    while pools.warm < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    print("ready" if pools.warm == 2 else f"{pools.warm} warm", flush=True)
    time.sleep(120)  # the learner's turn: SIGTERM arrives here
"""


def test_sigterm_removes_the_warm_sandboxes(base_image, docker_client):
    run_id = f"pytest-warm-sig-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen([sys.executable, "-c", _TRAINER, base_image, run_id], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert len(_containers(docker_client, run_id)) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert not _containers(docker_client, run_id)


@pytest.mark.slow
def test_train_keeps_warm_sandboxes_across_steps_and_leaves_none(tmp_path, base_image, docker_client,
                                                                 monkeypatch):
    """`swerl train` on ALFWorld in sandboxes (the game's one image): the second step's episodes start
    in sandboxes made ahead (during the first step and the update after it), evaluation takes its
    sandboxes from the same pools, and once `train` returns none of the run's containers is left."""
    import swerl.train
    from swerl.config import load
    from swerl.rollout.runner import read_results
    from swerl.train import TrainConfig, train

    run_id = f"pytest-warm-train-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("SWERL_RUN_ID", run_id)  # the label every container of this training run carries
    # the sandboxes made ahead are started while the learner updates: that is faster here, but on a
    # machine with a slow Docker daemon the update could win; step 2 then waits for them (they are still
    # the ones made ahead: what is checked is that its episodes take them, not how fast Docker is)
    pools, real_pools, real_sync = [], swerl.train._sandbox_pools, swerl.train._sync_weights

    def kept_pools(cfg, main, log):
        pools.append(real_pools(cfg, main, log))
        return pools[-1]

    async def sync_then_warm(cfg, engine, learner, tokenizer, run_dir, step):
        await real_sync(cfg, engine, learner, tokenizer, run_dir, step)
        if step == 1:  # (blocks the trainer's loop only: the pools make sandboxes on a loop of their own)
            _wait_warm(pools[0], 2)

    monkeypatch.setattr(swerl.train, "_sandbox_pools", kept_pools)
    monkeypatch.setattr(swerl.train, "_sync_weights", sync_then_warm)
    cfg = load(TrainConfig, "configs/alfworld_cpu.yaml", [
        f"run_dir={tmp_path}", "steps=2", "rollout.max_turns=2", "export_final=false", "checkpoint_every=0",
        "eval_every=2", "eval.limit=1", "metrics.progress=false"])
    assert cfg.rollout.warm == cfg.rollout.max_episodes == 2
    with Peak(docker_client, run_id) as peak:
        rows = train(cfg, log=None)
    assert [r["rollout/episodes_failed"] for r in rows] == [0, 0] and "val/success_rate" in rows[-1]
    by_step = {1: [], 2: []}
    for r in read_results(tmp_path / "rollouts.jsonl"):
        by_step[r.train_step].append(r.stats.sandbox_acquire_s)
    assert len(by_step[1]) == len(by_step[2]) == 4
    assert sum(s < 0.1 for s in by_step[2]) >= 2, by_step  # the step's first wave found theirs running
    # episodes and the evaluation stayed under max_episodes + warm (grading runs no container for games)
    assert 0 < peak.most <= 4
    assert not _containers(docker_client, run_id)
