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
