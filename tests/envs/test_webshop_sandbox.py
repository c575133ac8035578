"""WebShop inside the text-game sandbox image, behind the line-protocol server: the same scripted
episodes give the same transcripts as the in-process game, and the agent environment earns the same
reward on either."""

from __future__ import annotations

import asyncio

import pytest

from swerl.agent.engine import ScriptedEngine
from swerl.agent.episode import run_episode
from swerl.agent.tokenizer import load_tokenizer
from swerl.envs.textgame.client import SandboxTextGame
from swerl.envs.textgame.expert import scripted_turn
from swerl.envs.textgame.image import build_textgame_image
from swerl.envs.textgame.protocol import make_game
from swerl.envs.webshop.env import GAME_KWARGS, WebShopEnv
from swerl.envs.webshop.expert import expert_actions
from swerl.sandbox import DockerSandbox
from swerl.structs import SandboxSpec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def textgame_image(docker_client, base_image) -> str:
    return build_textgame_image(client=docker_client)


def transcript(game, goal_id: str, actions: list[str]) -> list[tuple]:
    obs = [game.reset(goal_id)] + [game.step(a) for a in actions]
    return [(o.observation, o.admissible, o.reward, o.won, o.done, o.valid, o.info) for o in obs]


def test_sandboxed_game_gives_the_in_process_transcript(textgame_image: str) -> None:
    local = make_game("webshop", catalog_dir="tasks/webshop")
    goals = local.catalog.goal_ids("test")[:3]
    scripts = {}
    for gid in goals:
        expert = expert_actions(local, gid)
        # detours: a second results page and back, a sub-page and back, invalid actions (one with
        # quotes, a newline and non-ASCII text), then the expert's purchase
        scripts[gid] = [expert[0], "click[next >]", "click[< prev]", "search[again]", expert[1],
                        'click[a "quoted"\nnewline — ü]', "click[features]", "click[< prev]", *expert[2:]]
    with DockerSandbox(SandboxSpec(image=textgame_image)) as sb, \
            SandboxTextGame(sb, "webshop", catalog_dir="tasks/webshop") as remote:
        for gid, actions in scripts.items():
            mine = transcript(local, gid, actions)
            theirs = transcript(remote, gid, actions)
            assert theirs == mine
            assert mine[-1][2] == 1.0 and mine[-1][4]  # bought, score 1.0
            assert [t[5] for t in mine].count(False) == 2  # the two invalid actions


def test_agent_env_on_the_sandboxed_game(textgame_image: str) -> None:
    tok = load_tokenizer()
    local = make_game("webshop", **GAME_KWARGS)
    gid = local.catalog.goal_ids("test")[5]
    actions = expert_actions(local, gid)
    turns = [scripted_turn("click[buy now]")] + [scripted_turn(a) for a in actions]  # one invalid first
    with DockerSandbox(SandboxSpec(image=textgame_image)) as sb, \
            SandboxTextGame(sb, "webshop", **GAME_KWARGS) as remote:
        env = WebShopEnv(remote, gid)
        traj = asyncio.run(run_episode(env, ScriptedEngine(tok, turns), tok,
                                       limits=env.config.episode_limits()))
    # 10 x score 1.0 - one invalid action x 0.1
    assert traj.terminated and env.score == 1.0 and traj.reward == pytest.approx(9.9)


def test_swerl_eval_expert_in_sandboxes(textgame_image: str, tmp_path) -> None:
    import json

    from swerl.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--game", "webshop", "--expert", "--limit", "3", "--max-steps", "15", "--workers",
                 "2", "--out", str(out), "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["episodes"] == 3 and rep["sample_errors"] == 0
    assert rep["success_rate"] == 1.0 and rep["mean_score"] == 1.0
