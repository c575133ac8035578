"""WebShop as an agent environment (TextGameEnv with WebShop's prompt and score reward), driven
through the real episode loop with the real Qwen tokenizer and a scripted policy."""

from __future__ import annotations

import asyncio
from math import isclose

import pytest

from swerl.agent.engine import ScriptedEngine
from swerl.agent.episode import run_episode
from swerl.agent.tokenizer import load_tokenizer
from swerl.envs.textgame.expert import scripted_turn
from swerl.envs.textgame.protocol import GAME_KINDS, make_game
from swerl.envs.webshop import WebShopGame
from swerl.envs.webshop.env import GAME_KWARGS, WEBSHOP_CONFIG, WebShopEnv
from swerl.envs.webshop.expert import expert_actions

GOAL = "test-0000"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def run(env: WebShopEnv, tok, turns: list[str]):
    engine = ScriptedEngine(tok, turns)
    return asyncio.run(run_episode(env, engine, tok, limits=env.config.episode_limits())), engine


def test_registered_and_constructed_like_the_server() -> None:
    assert GAME_KINDS["webshop"] == "swerl.envs.webshop:WebShopGame"
    game = make_game("webshop", **GAME_KWARGS)
    assert isinstance(game, WebShopGame) and not game.show_instruction


def test_expert_episode_earns_the_scaled_score(tok) -> None:
    game = make_game("webshop", **GAME_KWARGS)
    actions = expert_actions(game, GOAL)
    env = WebShopEnv(game, GOAL)
    traj, engine = run(env, tok, [scripted_turn(a, "shop") for a in actions])
    assert traj.terminated and traj.stop_reason == "won" and env.score == 1.0 and env.won
    assert traj.reward == 10.0  # score_scale 10 x score 1.0, no invalid action
    first = tok.decode(engine.prompts[0])
    goal = game.catalog.goal(GOAL)
    assert f"Shopping request: {goal.instruction_text}" in first
    assert "Current page (step 0 of at most 15):\nWebShop [SEP] Search" in first
    assert "Instruction:" not in first  # the request is stated once, not on every page
    assert "'search[<your query>]'" in first
    second = tok.decode(engine.prompts[1])
    assert ("Page after your action (step 1 of at most 15):\nBack to Search [SEP] Page 1 (Total "
            "results: ") in second
    assert f"'click[{goal.asin.lower()}]'" in second


def test_wrong_options_and_invalid_actions_shape_the_reward(tok) -> None:
    game = make_game("webshop", **GAME_KWARGS)
    goal = next(g for g in game.catalog.goals if g.split == "test" and len(g.goal_options) == 2
                and len(g.attributes) == 2)
    product = game.catalog.by_asin[goal.asin]
    wanted = {v for _, v in goal.goal_options}
    # one value of each option group that is not the goal's
    wrong = [next(v for v in g.values if v not in wanted) for g in product.options]
    expert = expert_actions(game, goal.goal_id)
    search, open_item = expert[0], expert[1]
    turns = [scripted_turn("click[buy now]"),  # not on the search page: invalid
             scripted_turn(search), scripted_turn(open_item),
             *[scripted_turn(f"click[{v}]") for v in wrong],
             scripted_turn("search[again]"),  # no search bar on the item page: invalid
             scripted_turn("click[buy now]")]
    env = WebShopEnv(game, goal.goal_id)
    traj, _ = run(env, tok, turns)
    # score: (2 attributes + 0 options + price) / (2 + 2 + 1) = 3/5, r_type 1
    assert isclose(env.score, 3 / 5) and not env.won and traj.stop_reason == "lost"
    # reward: 10 x 3/5 - 2 invalid x 0.1 = 5.8
    assert env.invalid_actions == 2 and isclose(traj.reward, 10 * 3 / 5 - 0.2)


def test_max_steps_truncates_without_a_purchase(tok) -> None:
    game = make_game("webshop", **GAME_KWARGS)
    env = WebShopEnv(game, GOAL)
    n = WEBSHOP_CONFIG.max_steps
    # search, then go back and forth between the results and the search page
    turns = [scripted_turn("search[shampoo]")] + [
        scripted_turn("click[back to search]" if i % 2 == 0 else "search[shampoo]") for i in range(n - 1)]
    traj, _ = run(env, tok, turns)
    assert traj.truncated and not traj.terminated and traj.stop_reason == "max_turns"
    assert traj.reward == 0.0 and env.score == 0.0 and env.steps == n


def test_score_scale_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="score_scale"):
        WebShopEnv(make_game("webshop", **GAME_KWARGS), GOAL, score_scale=-1.0)
