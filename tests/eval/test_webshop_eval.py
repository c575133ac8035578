"""`swerl eval --game webshop`: mean score and success rate on held-out goals through the generic
text-game evaluation, for the scripted expert (must be perfect) and for a random-init model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swerl.cli import main
from swerl.envs.webshop.env import eval_options, expert_plans, list_games


def test_eval_options_and_expert_plans() -> None:
    ids = list_games()
    assert len(ids) == 100 and ids[0] == "test-0000"
    opts = eval_options()
    assert opts.game_kwargs == {"catalog_dir": "tasks/webshop", "show_instruction": False}
    assert opts.group_of("test-0000") in {"beauty", "food", "fashion", "furniture", "electronics"}
    # the env pays score_scale x the purchase score; the budget is verl-agent's 15 steps
    from swerl.envs.webshop.env import WebShopEnv
    from swerl.envs.webshop.game import WebShopGame

    env = opts.make_env(WebShopGame(**opts.game_kwargs), ids[0], opts.prompt, opts.config)
    assert isinstance(env, WebShopEnv) and env.score_scale == 10.0 and env.config.max_steps == 15
    assert opts.config.win_reward == 0.0
    assert eval_options(score_scale=2.5).make_env(env.game, ids[0], opts.prompt,
                                                  opts.config).score_scale == 2.5
    plans = expert_plans(ids[:3])
    assert len(plans) == 3 and all(p[-1] == "click[buy now]" and p[0].startswith("search[")
                                   for p in plans.values())


def test_expert_through_swerl_eval_scores_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    rc = main(["eval", "--game", "webshop", "--expert", "--in-process", "--limit", "25", "--out", str(out),
               "--quiet"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["kind"] == "webshop" and rep["episodes"] == 25 and rep["sample_errors"] == 0
    assert rep["success_rate"] == 1.0 and rep["mean_score"] == 1.0
    assert sum(g["episodes"] for g in rep["by_group"].values()) == 25 and len(rep["by_group"]) >= 4
    assert rep["invalid_action_rate"] == 0.0 and rep["stop_reasons"] == {"won": 25}
    # WebShop's episode reward: 10 x the purchase score (no win bonus on top), no invalid actions
    assert rep["mean_episode_reward"] == 10.0
    assert "success 100.0% (25/25), mean score 1.000" in capsys.readouterr().out
    samples = sorted((out / "samples").glob("*.json"))
    assert len(samples) == 25
    one = json.loads(samples[0].read_text())
    assert one["score"] == 1.0 and one["won"] and one["group"] in rep["by_group"]


@pytest.mark.slow
def test_random_model_through_swerl_eval(tmp_path: Path) -> None:
    from swerl.models import make_tiny_qwen

    model = make_tiny_qwen(tmp_path / "tiny")
    out = tmp_path / "eval"
    rc = main(["eval", "--game", "webshop", "--model", str(model), "--in-process", "--limit", "2",
               "--max-steps", "2", "--max-new-tokens", "16", "--seed", "0", "--out", str(out), "--quiet"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    # a random-init model writes no well-formed action: it never buys, so it scores 0
    assert rep["episodes"] == 2 and rep["sample_errors"] == 0
    assert rep["mean_score"] == 0.0 and rep["success_rate"] == 0.0
