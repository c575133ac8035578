"""SWEEnv: an agent episode on a shipped instance, graded by SWE-bench's grading in a fresh container."""

from __future__ import annotations

import asyncio

import pytest
from swe_fixtures import pick, swe_suite  # noqa: F401  (fixture)

from swerl.agent import ScriptedEngine, load_tokenizer, run_episode
from swerl.agent import tool_call_text as call
from swerl.envs.swe import SWEEnv
from swerl.envs.swe.images import resolve_image
from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.structs import EpisodeLimits

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _episode(instance, script, tokenizer, limits=None):
    image = resolve_image(instance)
    with DockerSandbox(SandboxSpec(image=image)) as sb:
        env = SWEEnv(sb, instance, image=image)
        traj = asyncio.run(run_episode(env, ScriptedEngine(tokenizer, script), tokenizer,
                                       limits=limits or EpisodeLimits()))
        grade = env.grade(traj)
    return env, traj, grade


def _apply(patch: str) -> str:
    return call("bash", {"command": f"cd /testbed && git apply - <<'SWERL_EOF'\n{patch}SWERL_EOF"})


def test_submitting_the_gold_fix_earns_reward_one(swe_suite, tokenizer):  # noqa: F811
    inst = pick(swe_suite, "inflection")
    _, traj, grade = _episode(inst, [_apply(inst.patch), call("submit")], tokenizer)
    assert traj.terminated and traj.stop_reason == "submit"
    assert traj.reward == 1.0 and grade.resolved and grade.reward == 1.0
    assert set(grade.fail_to_pass_success) == set(inst.fail_to_pass)
    # the prompt the agent saw carries the issue text
    assert inst.problem_statement.strip()[:40] in tokenizer.decode(traj.token_ids[: traj.prompt_len])


def test_submitting_nothing_earns_zero(swe_suite, tokenizer):  # noqa: F811
    inst = pick(swe_suite, "inflection")
    _, traj, grade = _episode(inst, [call("submit")], tokenizer)
    assert traj.reward == 0.0 and not grade.resolved and grade.empty_patch


def test_a_truncated_episode_is_graded_on_the_working_tree(swe_suite, tokenizer):  # noqa: F811
    inst = pick(swe_suite, "six")
    _, traj, grade = _episode(inst, [_apply(inst.patch)], tokenizer, limits=EpisodeLimits(max_turns=1))
    assert traj.truncated and traj.stop_reason == "max_turns" and traj.reward is None
    assert grade.resolved and grade.reward == 1.0
