"""The README's main job (for now): the scripted agent episode of `swerl sandbox demo`."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from swerl.demo import run_demo

pytestmark = pytest.mark.docker


def test_demo_episode_fixes_the_bug_token_exactly(task_image):
    out = io.StringIO()
    traj = run_demo(Console(file=out, width=100))
    assert traj.terminated and traj.stop_reason == "submit"
    assert "+    return sum(values) / len(values)" in traj.result
    assert traj.num_turns == 5 and traj.num_tool_calls == 5 and traj.num_malformed == 0
    assert traj.drift_tokens == 0
    assert "3 passed" in out.getvalue() and "Network is unreachable" in out.getvalue()


@pytest.mark.slow
def test_demo_with_a_real_model_shows_its_own_turns_token_exactly(task_image):
    """`swerl sandbox demo --model smollm2-135m-instruct`: the real model plays the episode (it does not
    fix the bug; its turns are shown as it wrote them), and the trajectory is still token-exact."""
    out = io.StringIO()
    traj = run_demo(Console(file=out, width=1000), model="smollm2-135m-instruct", max_turns=2,
                    max_new_tokens=48)
    text = out.getvalue()
    assert "plays the episode (tools described by swerl's system-message block)" in text
    assert 1 <= traj.num_turns <= 2 and traj.drift_tokens == 0
    assert "model turn 0" in text and ("did not submit the fix" in text or "fixed the bug" in text)
    assert traj.terminated or traj.truncated  # the episode ended one way or the other, never vanished
