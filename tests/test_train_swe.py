"""SWE training end to end: rollouts in real sandboxes graded by SWE-bench's grading (submitted
patches and the working tree of budget-cut episodes), DAPO re-sampling, the `swerl train` debug run,
and bad input failing before any work."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from swerl.config import load
from swerl.runlog import TrainDisplay
from swerl.train import TrainConfig, _rollout_row, train
from swerl.train import _collect as _collect_on

pytestmark = pytest.mark.docker

TASK = "toolz__toolz-1"


def _collect(*args, **kwargs):
    """One step's rollouts, on an event loop of their own (train() runs one for the whole run)."""
    with asyncio.Runner() as aio:
        return _collect_on(aio, *args, **kwargs)


def _cfg(tmp_path, *extra: str) -> TrainConfig:
    return load(TrainConfig, "configs/debug_cpu.yaml", [
        f"run_dir={tmp_path}", "rollout.max_turns=2", "rollout.max_episodes=1", "rollout.max_new_tokens=4096",
        f"env.swe.instance_ids=[{TASK}]", *extra])


def _script(tok, inst, turns):
    from swe_fixtures import slow_gold_command

    from swerl.agent import ScriptedEngine
    from swerl.agent import tool_call_text as call
    from swerl.envs.swe.forgers import FORGERS

    texts = {"gold": call("bash", {"command": "cd /testbed && git apply - <<'SWERL_EOF'\n"
                                              f"{inst.patch}SWERL_EOF"}),
             "forge": call("bash", {"command": "cd /testbed && cat >> toolz/__init__.py <<'SWERL_EOF'\n"
                                               f"{FORGERS['swallow-exceptions'][1]}SWERL_EOF"}),
             "submit": call("submit"), "idle": "Let me think about this some more.",
             "slowgold": call("bash", {"command": "cd /testbed && "
                                                  + slow_gold_command(inst.patch, "toolz")}),
             "plant": call("bash", {"command": "cd /testbed && printf 'import sys\\nsys.exit(0)\\n' "
                                               "> pytest.py"})}
    return ScriptedEngine(tok, [texts[t] for t in turns])


@pytest.fixture(scope="module")
def toolz_tasks(base_image):
    from swerl.envs.swe.tasks import SWETaskConfig, SWETaskSet

    return SWETaskSet(SWETaskConfig(instance_ids=(TASK,)))


@pytest.mark.slow
def test_rewards_come_from_swebench_grading_of_submitted_and_budget_cut_episodes(toolz_tasks, tmp_path):
    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    inst = toolz_tasks.instances[TASK]
    # one task, a group of 3 run one after another (max_episodes 1):
    #   0: applies the fix and submits              → graded at submit: resolved, reward 1
    #   1: applies the fix, then runs out of turns  → its working tree is graded: resolved, reward 1
    #   2: never acts                               → empty diff: reward 0 without a grading run
    engine = _script(tok, inst, ["gold", "submit", "gold", "idle", "idle", "idle"])
    cfg = _cfg(tmp_path, "group_size=3", "batch_episodes=3")
    ro = _collect(cfg, engine, tok, toolz_tasks, random.Random(0), tmp_path,
                  TrainDisplay(1, enabled=False, log=None))
    by_sample = {r.sample: r.trajectory for r in ro.results}
    assert [by_sample[i].reward for i in range(3)] == [1.0, 1.0, 0.0]
    assert by_sample[0].terminated and by_sample[0].stop_reason == "submit"
    assert by_sample[1].truncated and by_sample[1].stop_reason == "max_turns"
    assert ro.groups == [0, 0, 0] and len(ro.trajectories) == 3
    row = _rollout_row(cfg, ro)
    assert row["reward/success_rate"] == pytest.approx(2 / 3) and row["rollout/episodes_failed"] == 0
    assert row["rollout/truncated_rate"] == pytest.approx(2 / 3)
    logged = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(d["trajectory"]["reward"] for d in logged) == [0.0, 1.0, 1.0]


@pytest.mark.slow
def test_dapo_replaces_a_group_without_signal(toolz_tasks, tmp_path):
    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    inst = toolz_tasks.instances[TASK]
    # round 1: both episodes idle (rewards 0, 0: no signal) → the group is re-sampled;
    # round 2: one fixes and submits, one idles (rewards 1, 0) → kept
    engine = _script(tok, inst, ["idle"] * 4 + ["gold", "submit", "idle", "idle"])
    cfg = _cfg(tmp_path, "group_size=2", "batch_episodes=2", "algo.dapo_filter=true", "dapo_max_rounds=2")
    ro = _collect(cfg, engine, tok, toolz_tasks, random.Random(0), tmp_path,
                  TrainDisplay(1, enabled=False, log=None))
    assert ro.rounds == 2 and len(ro.results) == 4
    assert sorted(t.reward for t in ro.trajectories) == [0.0, 1.0]
    assert _rollout_row(cfg, ro)["rollout/dapo_rounds"] == 2


@pytest.mark.slow
def test_tampering_is_undone_by_the_grading_and_counted(toolz_tasks, tmp_path):
    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    inst = toolz_tasks.instances[TASK]
    # 0: plants a pytest.py, applies the fix and submits → the fix counts, the plant is dropped and recorded
    # 1: plants it and runs out of turns                 → graded on its working tree: reward 0, recorded
    engine = _script(tok, inst, ["plant", "gold", "submit", "plant", "idle", "idle"])
    cfg = _cfg(tmp_path, "group_size=2", "batch_episodes=2", "rollout.max_turns=3")
    ro = _collect(cfg, engine, tok, toolz_tasks, random.Random(0), tmp_path,
                  TrainDisplay(1, enabled=False, log=None))
    by_sample = {r.sample: r.trajectory for r in ro.results}
    assert [by_sample[i].reward for i in range(2)] == [1.0, 0.0]
    assert [by_sample[i].tampered_files for i in range(2)] == [("pytest.py",), ("pytest.py",)]
    row = _rollout_row(cfg, ro)
    assert row["reward/tamper_rate"] == 1.0 and row["reward/success_rate"] == 0.5


@pytest.mark.slow
def test_a_forged_test_run_scores_zero_and_is_counted(toolz_tasks, tmp_path):
    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    inst = toolz_tasks.instances[TASK]
    # 0: library code that swallows every test's exception, submitted → the canaries see it: reward 0
    # 1: the fix, submitted                                             → reward 1, nothing tampered
    engine = _script(tok, inst, ["forge", "submit", "gold", "submit"])
    cfg = _cfg(tmp_path, "group_size=2", "batch_episodes=2")
    ro = _collect(cfg, engine, tok, toolz_tasks, random.Random(0), tmp_path,
                  TrainDisplay(1, enabled=False, log=None))
    by_sample = {r.sample: r.trajectory for r in ro.results}
    assert [by_sample[i].reward for i in range(2)] == [0.0, 1.0]
    assert "must fail" in by_sample[0].tampered and not by_sample[1].tampered
    row = _rollout_row(cfg, ro)
    assert row["reward/tamper_rate"] == 0.5 and row["rollout/episodes_failed"] == 0


@pytest.mark.slow
def test_a_grading_that_fails_fails_the_episode_it_never_scores_zero(toolz_tasks, tmp_path, docker_client):
    from swe_fixtures import GradingKiller

    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    inst = toolz_tasks.instances[TASK]
    # both episodes fix the bug and submit; every grading container is killed mid-test
    engine = _script(tok, inst, ["slowgold", "submit", "slowgold", "submit"])
    cfg = _cfg(tmp_path, "group_size=2", "batch_episodes=2")
    with GradingKiller(docker_client) as killer:
        ro = _collect(cfg, engine, tok, toolz_tasks, random.Random(0), tmp_path,
                      TrainDisplay(1, enabled=False, log=None))
    assert len(killer.killed) == 2
    assert [(r.trajectory, r.error_kind) for r in ro.results] == [(None, "grading")] * 2
    assert "failed (sandbox)" in ro.results[0].error
    assert ro.trajectories == [] and ro.groups == []  # nothing to train on; nobody scored 0
    row = _rollout_row(cfg, ro)
    assert row["rollout/episodes_failed"] == 2 and row["rollout/failed_rate"] == 1.0
    assert row["rollout/failed/grading"] == 2
    logged = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [d["error_kind"] for d in logged] == ["grading", "grading"]


@pytest.mark.slow
def test_debug_run_trains_checkpoints_exports_and_resumes(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = load(TrainConfig, "configs/debug_cpu.yaml", [f"run_dir={tmp_path}", "steps=1", "checkpoint_every=1",
                                                        "rollout.max_new_tokens=16", "rollout.max_turns=2"])
    rows = train(cfg, log=None)
    assert len(rows) == 1 and rows[0]["rollout/episodes_run"] == 4 and rows[0]["rollout/episodes_failed"] == 0
    assert rows[0]["rollout/episodes_trained"] == 4 and not rows[0]["actor/skipped"]
    assert rows[0]["aem/alpha_max"] >= 1.0 and rows[0]["actfocus/weight_reasoning"] == pytest.approx(
        0.3, rel=rows[0]["actor/tokens"] * 2**-24)  # a float32 mean of N equal weights
    # the last step evaluates (eval_every): one held-out instance through swerl eval's code, its report kept
    assert rows[0]["val/episodes"] + rows[0]["val/failed"] == 1 and rows[0]["val/failed"] == 0
    assert 0.0 <= rows[0]["val/success_rate"] <= 1.0 and rows[0]["val/turns_mean"] >= 1
    report = json.loads((tmp_path / "eval" / "step_00000001" / "report.json").read_text())
    assert report["samples_ran"] == 1 and report["model_name_or_path"] == f"{tmp_path.name}@step1"
    assert report["submitted_ids"] or report["empty_patch_ids"] or report["unresolved_ids"]
    assert (tmp_path / "checkpoints" / "step_00000001").is_dir()
    AutoModelForCausalLM.from_pretrained(tmp_path / "policy")  # a plain HF checkpoint, with its tokenizer
    assert (tmp_path / "policy" / "tokenizer_config.json").is_file()
    rollouts = tmp_path / "rollouts.jsonl"
    assert {json.loads(line)["train_step"] for line in rollouts.read_text().splitlines()} == {1}
    # a row of a step past the checkpoint (a run killed after its rollouts, before its checkpoint)
    with rollouts.open("a") as f:
        f.write(json.dumps({"task_id": "x", "group": 0, "sample": 0, "train_step": 2, "error": "cut me"})
                + "\n")
    # resume: one more step continues the same run (metrics row 2 appended after row 1)
    more = load(TrainConfig, "configs/debug_cpu.yaml", [f"run_dir={tmp_path}", "steps=2",
                                                        "checkpoint_every=1", "rollout.max_new_tokens=16",
                                                        "rollout.max_turns=2"])
    rows2 = train(more, log=None)
    assert [r["train_step"] for r in rows2] == [2]
    logged = [json.loads(line)["train_step"]
              for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2]
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert [r["train_step"] for r in rows] == [1] * 4 + [2] * 4 and "cut me" not in rollouts.read_text()


def test_bad_input_fails_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"model\.path '/nowhere/no-such-model': no such directory"):
        train(load(TrainConfig, "configs/debug_cpu.yaml",
                   [f"run_dir={tmp_path}/a", "model.path=/nowhere/no-such-model"]), log=None)
    with pytest.raises(ValueError, match=r"model\.tokenizer '/nowhere/tok': no such directory"):
        train(load(TrainConfig, "configs/debug_cpu.yaml",
                   [f"run_dir={tmp_path}/t", "model.tokenizer=/nowhere/tok"]), log=None)
    with pytest.raises(ValueError, match=r"no split 'nosuchsplit' — the splits present are heldout, train"):
        train(load(TrainConfig, "configs/debug_cpu.yaml",
                   [f"run_dir={tmp_path}/b", "env.swe.split=nosuchsplit", "env.swe.instance_ids=[]"]),
              log=None)
    from swerl.rollout.engine import EngineError

    with pytest.raises(EngineError, match="not healthy"):
        train(load(TrainConfig, "configs/debug_cpu.yaml", [
            f"run_dir={tmp_path}/c", "rollout.engine=vllm", "rollout.vllm.urls=[http://127.0.0.1:9]",
            "rollout.vllm.startup_timeout_s=1"]), log=None)
    assert not (tmp_path / "c" / "metrics.jsonl").exists()
