"""The episode runner: many episodes at once on real Docker sandboxes, failures recorded (never raised),
stats measured, results appended durably to JSONL; and an HFEngine driving real episodes."""

from __future__ import annotations

import asyncio
import json

import pytest
from rollout_helpers import trajectory_logprobs

from swerl.agent import ToolEnv, tool_call_text
from swerl.rollout import EngineError, EpisodeSpec, HFEngine, ResultsWriter, read_results, run_episodes
from swerl.sandbox import SandboxSpec
from swerl.structs import (
    EpisodeLimits,
    EpisodeResult,
    EpisodeStats,
    Generation,
    SamplingParams,
    StepResult,
    Trajectory,
)

pytestmark = pytest.mark.docker

CALC = "/testbed/calc/__init__.py"
TASK = "mean() in calc/__init__.py returns the wrong value. Fix it."



def turn(thought: str, name: str, **arguments) -> str:
    return f"<think>\n{thought}\n</think>\n\n" + tool_call_text(name, arguments)


SCRIPT = [
    turn("Look at the code.", "str_replace_editor", command="view", path=CALC),
    turn("List the tests.", "bash", command="ls /testbed/tests"),
    turn("Done.", "submit"),
]


class TurnScriptedPolicy:
    """A scripted policy (not a model, not a fake service) that many episodes can share: the reply
    depends only on how many assistant turns the prompt already holds, so interleaving does not
    matter. Records the most generate calls in flight at once. `hang_on` makes calls whose prompt
    contains that text never return (a stuck engine)."""

    def __init__(self, tok, script, *, delay_s: float = 0.02, hang_on: str | None = None) -> None:
        self.tok, self.script, self.delay_s, self.hang_on = tok, script, delay_s, hang_on
        self.im_start = tok.convert_tokens_to_ids("<|im_start|>")
        self.assistant = tok("assistant", add_special_tokens=False)["input_ids"]
        self.in_flight = self.max_in_flight = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.hang_on and self.hang_on in self.tok.decode(prompt_ids):
                await asyncio.sleep(3600)
            n = sum(1 for i, t in enumerate(prompt_ids)
                    if t == self.im_start and prompt_ids[i + 1:i + 1 + len(self.assistant)] == self.assistant)
            ids = [*self.tok(self.script[n - 1], add_special_tokens=False)["input_ids"],
                   self.tok.eos_token_id]
            return Generation(tuple(ids), tuple([-0.5] * len(ids)), "stop")
        finally:
            self.in_flight -= 1


class KillOnSecondStep:
    """Wraps a ToolEnv; kills its container before the second tool call (the sandbox dies mid-episode).
    Records its `close` calls: (was the sandbox still held at the call)."""

    def __init__(self, env: ToolEnv) -> None:
        self.env, self.action_format, self.steps = env, env.action_format, 0
        self.closes: list[bool] = []

    def close(self) -> None:
        self.closes.append(not self.env.sandbox.closed)

    def reset(self):
        return self.env.reset()

    def step(self, parsed):
        self.steps += 1
        if self.steps == 2:
            self.env.sandbox.container.kill()
        return self.env.step(parsed)


def test_runner_runs_episodes_concurrently_and_records_failures(tok, task_image, tmp_path):
    spec = SandboxSpec(image=task_image, memory="512m")
    seen, live = [], {"max": 0}

    def tool_env(task=TASK):
        def make(sb):
            seen.append(sb)  # sandboxes in use right now: handed out and not yet closed (released)
            live["max"] = max(live["max"], sum(not b.closed for b in seen))
            return ToolEnv(sb, task)
        return make

    def broken_factory(sb):
        raise ValueError("no such task")

    specs = [EpisodeSpec(f"calc-{g}", g, s, tool_env(), spec) for g in range(2) for s in range(3)]
    dying: list[KillOnSecondStep] = []
    specs.append(EpisodeSpec("dies", 2, 0,
                             lambda sb: dying.append(KillOnSecondStep(ToolEnv(sb, TASK))) or dying[-1], spec))
    specs.append(EpisodeSpec("broken", 3, 0, broken_factory, spec))
    specs.append(EpisodeSpec("stuck", 4, 0, tool_env("STUCK " + TASK), spec))
    policy = TurnScriptedPolicy(tok, SCRIPT, hang_on="STUCK")
    out = tmp_path / "run" / "rollouts.jsonl"

    results = asyncio.run(run_episodes(specs, policy, tok, max_episodes=4, engine_concurrency=2,
                                       engine_timeout_s=2.0, warm=1, max_containers=4, results_path=out,
                                       progress=True, limits=EpisodeLimits(max_turns=5)))

    assert [(r.task_id, r.group, r.sample) for r in results] == [(s.task_id, s.group, s.sample)
                                                                 for s in specs]
    good = results[:6]
    for r in good:
        assert r.ok and r.error == "" and r.error_kind == ""
        tr = r.trajectory
        assert tr.terminated and tr.stop_reason == "submit" and tr.num_tool_calls == 3
        assert "tests" in tr.turns[1].observation or "test_calc.py" in tr.turns[1].observation
        st = r.stats
        assert (st.turns, st.tool_calls, st.malformed, st.engine_calls) == (3, 3, 0, 3)
        assert st.generated_tokens == sum(tr.loss_mask) and st.total_tokens == len(tr.token_ids)
        assert st.prompt_tokens == tr.prompt_len
        assert (st.env_s > 0 and st.engine_s >= 3 * policy.delay_s
                and st.wall_s >= st.env_s + st.engine_s - 1e-6)
        assert 0 <= st.engine_queue_s <= st.engine_s and st.sandbox_acquire_s > 0
    dies, broken, stuck = results[6:]
    assert not dies.ok and dies.error_kind == "sandbox" and dies.error.startswith("SandboxDied")
    assert dies.stats.engine_calls == 2  # it died at its second tool call
    assert dying[0].closes == [True]  # a failed episode's env is closed too, once, before its sandbox goes
    assert not broken.ok and broken.error_kind == "env" and ("make_env: ValueError: no such "
                                                             "task") in broken.error
    assert not stuck.ok and stuck.error_kind == "engine_timeout" and "longer than 2.0 s" in stuck.error
    # the bounds held
    assert live["max"] <= 4 and policy.max_in_flight <= 2
    # every result is in the file (in finishing order), exactly as returned
    on_disk = read_results(out)
    assert sorted(r.to_json() for r in on_disk) == sorted(r.to_json() for r in results)


def test_results_file_survives_a_torn_last_line(tmp_path):
    tr = Trajectory(token_ids=(1, 2, 3), loss_mask=(0, 1, 1), span=(0, 1, 2), logprobs=(0.0, -1.0, -2.0),
                    turn_index=(-1, 0, 0), prompt_len=1, terminated=True, truncated=False,
                    stop_reason="submit")
    ok = EpisodeResult("t", 0, 0, tr, stats=EpisodeStats(turns=1, generated_tokens=2))
    bad = EpisodeResult("t", 0, 1, None, error="EngineTimeout: slow", error_kind="engine_timeout")
    path = tmp_path / "rollouts.jsonl"
    with ResultsWriter(path) as w:
        w.write(ok)
        w.write(bad)
    # a crash in the middle of a third write leaves part of a line
    line = ok.to_json().encode()
    with open(path, "ab") as f:
        f.write(line[:len(line) // 2])
    assert read_results(path) == [ok, bad]
    # reopening cuts the torn tail, so the next record starts on its own line
    with ResultsWriter(path) as w:
        w.write(ok)
    assert read_results(path) == [ok, bad, ok]
    assert path.read_bytes().count(b"\n") == 3
    # corruption before the last line is not silently skipped
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b"{not json", *lines[1:]]))
    with pytest.raises(ValueError, match=r"rollouts.jsonl:2"):
        read_results(path)
    # the records round-trip exactly
    assert (EpisodeResult.from_json(bad.to_json()) == bad
            and json.loads(ok.to_json())["trajectory"]["prompt_len"] == 1)


def test_result_needs_exactly_one_of_trajectory_and_error():
    with pytest.raises(ValueError, match="exactly one"):
        EpisodeResult("t", 0, 0, None)


def test_hf_engine_drives_real_episodes_and_trajectory_logprobs_are_the_models(tok, task_image,
                                                                               tiny_model_dir,
                                                                              reference_model):
    """The random model writes no valid tool call: every turn is malformed and answered with an error
    observation, so episodes run several turns with observations in between. Stopping on a large set
    of token ids keeps turns short. The logprob of every generated token in the final trajectory must
    equal a teacher-forced pass over the whole trajectory."""
    spec = SandboxSpec(image=task_image, memory="512m")
    engine = HFEngine(tiny_model_dir, seed=3, batch_window_s=0.02)
    stop = tuple(range(0, 151643, 3))  # about a third of the vocabulary ends a turn
    params = SamplingParams(max_new_tokens=6, stop_token_ids=stop)
    specs = [EpisodeSpec("calc", 0, s, lambda sb: ToolEnv(sb, TASK), spec) for s in range(3)]
    results = asyncio.run(run_episodes(specs, engine, tok, params=params, limits=EpisodeLimits(max_turns=3),
                                       max_episodes=3, engine_concurrency=3, progress=False, warm=0))
    assert max(engine.batch_sizes) > 1 or engine.joined > 0  # concurrent episodes shared batches
    for r in results:
        assert r.ok, r.error
        tr = r.trajectory
        assert tr.num_turns >= 1 and r.stats.engine_calls == tr.num_turns
        assert tr.num_turns == tr.num_malformed + (tr.stop_reason in ("max_new_tokens", "max_context"))
        gen_lp = [lp for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if m]
        # two fp32 passes over longer contexts: see rollout_helpers
        assert gen_lp == pytest.approx(trajectory_logprobs(reference_model, list(tr.token_ids),
                                                           list(tr.loss_mask)),
                                       abs=3e-4)
    assert any(r.trajectory.num_turns > 1 for r in results)
    asyncio.run(engine.close())
    with pytest.raises(EngineError):
        asyncio.run(engine.generate([1, 2], params))


def test_no_server_left_stops_the_run_and_leaves_no_sandbox(tok, task_image, docker_client):
    """An engine with no server left (`EngineUnavailable`) would fail every episode after it: the run
    stops with that error instead of turning it into failed episodes, and its sandboxes are removed."""
    from swerl.rollout.engine import EngineUnavailable
    from swerl.sandbox.lifecycle import LABEL_RUN

    class Gone:
        async def generate(self, prompt_ids, params):
            raise EngineUnavailable("every worker left the rotation: http://w1, http://w2")

    spec = SandboxSpec(image=task_image, memory="512m")
    specs = [EpisodeSpec(f"calc-{i}", i, 0, lambda sb: ToolEnv(sb, TASK), spec) for i in range(3)]
    with pytest.raises(EngineUnavailable, match="every worker left"):
        asyncio.run(run_episodes(specs, Gone(), tok, limits=EpisodeLimits(max_turns=2), max_episodes=3,
                                 run_id="pytest-engine-gone"))
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}=pytest-engine-gone"}) == []


def test_the_report_hook_travels_with_the_result_and_a_failing_hook_fails_the_episode(tok, task_image):
    """`EpisodeSpec.report` takes plain values from the env where the episode ran (a cluster's host too)
    and they come back as `EpisodeResult.report`; a finish or report hook that raises fails the episode
    (kind `env`) instead of breaking the runner, and its trajectory is not kept."""
    def make(report=None, finish=None, i=0):
        return EpisodeSpec(task_id=f"t{i}", group=i, sample=0, sandbox=SandboxSpec(image=task_image),
                           make_env=lambda sb: ToolEnv(sb, TASK), report=report, finish=finish)

    def boom(env, trajectory):
        raise RuntimeError("finish broke")

    def bad_report(env):
        raise KeyError("no such fact")

    specs = [make(report=lambda env: ("task", env.task), i=0), make(finish=boom, i=1),
             make(report=bad_report, i=2), make(i=3)]
    res = asyncio.run(run_episodes(specs, TurnScriptedPolicy(tok, SCRIPT), tok, max_episodes=2,
                                   progress=False))
    assert res[0].ok and res[0].report == ("task", TASK) and res[0].stats.finish_s == 0.0
    assert not res[1].ok and res[1].error_kind == "env" and "finish: RuntimeError: finish broke" in \
        res[1].error
    assert not res[2].ok and res[2].error_kind == "env" and "report: KeyError" in res[2].error
    assert res[3].ok and res[3].report is None
    assert "report" not in json.loads(res[0].to_json())  # in memory only


class BarrierStep:
    """An env (no sandbox) whose one step blocks its worker thread, as a tool call does, until `barrier`'s
    parties are all in their steps (or its timeout: then the step raises and the episode fails)."""

    action_format = ToolEnv.action_format

    def __init__(self, barrier) -> None:
        self.barrier = barrier

    def reset(self):
        return ToolEnv(None, "wait").reset()

    def step(self, turn):
        self.barrier.wait()
        return StepResult(observation="done", terminated=True)


def test_every_running_episode_gets_a_worker_thread_for_its_tool_calls(tok):
    """40 episodes at once (max_episodes=40), each in a step that blocks until all 40 are in theirs: they
    all get there. The loop's own thread pool has min(32, cores + 4) workers, so without the runner sizing
    it the barrier would never fill and every episode would fail."""
    import threading

    n = 40
    barrier = threading.Barrier(n, timeout=60)
    specs = [EpisodeSpec(f"t{i}", i, 0, lambda sb: BarrierStep(barrier), None) for i in range(n)]
    policy = TurnScriptedPolicy(tok, [turn("wait", "bash", command="sleep 1")])
    results = asyncio.run(run_episodes(specs, policy, tok, max_episodes=n, progress=False,
                                       limits=EpisodeLimits(max_turns=1)))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
