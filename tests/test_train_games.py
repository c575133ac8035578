"""Text games in the training loop: ALFWorld / WebShop episodes through the text-game harness get the
env's rewards (win / purchase score minus invalid-action penalties), in process and in sandboxes."""

from __future__ import annotations

import asyncio
import random

import pytest

from swerl.config import load
from swerl.runlog import TrainDisplay
from swerl.train import TrainConfig, _rollout_row, train
from swerl.train import _collect as _collect_on


def _collect(*args, **kwargs):
    """One step's rollouts, on an event loop of their own (train() runs one for the whole run)."""
    with asyncio.Runner() as aio:
        return _collect_on(aio, *args, **kwargs)



def _quiet() -> TrainDisplay:
    return TrainDisplay(1, enabled=False, log=None)


@pytest.mark.slow
def test_webshop_expert_episodes_earn_the_purchase_reward(tmp_path):
    from swerl.agent import load_tokenizer
    from swerl.envs.textgame.expert import ExpertEngine
    from swerl.envs.webshop.env import expert_plans
    cfg = load(TrainConfig, "configs/webshop_cpu.yaml", [f"run_dir={tmp_path}", "env.webshop.limit=3"])
    tasks = cfg.env.spec.task_set(cfg.env.webshop, max_steps=cfg.rollout.max_turns)
    tok = load_tokenizer()
    engine = ExpertEngine(tok, expert_plans(list(tasks.ids)))
    ro = _collect(cfg, engine, tok, tasks, random.Random(0), tmp_path, _quiet())
    # every goal of the shipped catalog is achievable: the expert buys the right product with the right
    # options, purchase score 1.0 → reward score_scale × 1.0 = 10, no invalid actions
    assert [t.reward for t in ro.trajectories] == [10.0] * 4
    assert all(t.stop_reason == "won" and t.terminated for t in ro.trajectories)
    assert _rollout_row(cfg, ro)["reward/success_rate"] == 1.0


@pytest.mark.slow
@pytest.mark.docker
def test_alfworld_in_sandboxes_expert_wins_and_idle_episode_scores_zero(tmp_path, base_image):
    from swerl.agent import ScriptedEngine, load_tokenizer
    from swerl.envs.alfworld import list_games, walkthrough
    from swerl.envs.textgame.expert import scripted_turn

    game_id = list_games(None, "train")[0]
    plan = walkthrough(None, game_id)
    budget = len(plan) + 1
    cfg = load(TrainConfig, "configs/alfworld_cpu.yaml", [
        f"run_dir={tmp_path}", "rollout.max_episodes=1", "group_size=2", "batch_episodes=2",
        f"rollout.max_turns={budget}", "env.alfworld.limit=1"])
    tasks = cfg.env.spec.task_set(cfg.env.alfworld, max_steps=budget)
    assert tasks.ids == (game_id,)
    tok = load_tokenizer()
    # episode 0: one inadmissible action, then the expert plan → 10 − 0.1; episode 1: only malformed
    # turns until the budget → no env reward → 0
    turns = [scripted_turn("fly to the moon"), *(scripted_turn(a) for a in plan),
             *["no action here"] * budget]
    ro = _collect(cfg, ScriptedEngine(tok, turns), tok, tasks, random.Random(0), tmp_path, _quiet())
    by_sample = {r.sample: r.trajectory for r in ro.results}
    assert by_sample[0].reward == pytest.approx(10.0 - 0.1) and by_sample[0].stop_reason == "won"
    assert by_sample[1].reward == 0.0 and by_sample[1].truncated
    assert _rollout_row(cfg, ro)["reward/success_rate"] == 0.5


@pytest.mark.slow
def test_webshop_train_run_in_process(tmp_path):
    rows = train(load(TrainConfig, "configs/webshop_cpu.yaml", [f"run_dir={tmp_path}", "steps=1",
                                                                "rollout.max_turns=3"]), log=None)
    assert (rows[0]["rollout/episodes_run"] == 4 and rows[0]["rollout/episodes_failed"] == 0
            and not rows[0]["actor/skipped"])
    assert (tmp_path / "policy" / "config.json").is_file()
