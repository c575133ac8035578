"""The training loop end to end on CPU: a tiny random-init model learns the toy multi-turn game
(swerl/learner/toy.py) with plain GRPO and with AEM + ActFocus; runs resume exactly."""

from __future__ import annotations

import json

import pytest

from swerl.config import load
from swerl.train import TrainConfig, train

CONFIG = "configs/toy_cpu.yaml"


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.slow
@pytest.mark.parametrize("switches", [
    [],  # plain GRPO
    ["algo.aem.enabled=true", "algo.actfocus.enabled=true"],
], ids=["grpo", "aem+actfocus"])
def test_it_learns(tmp_path, switches):
    cfg = load(TrainConfig, CONFIG, [f"run_dir={tmp_path}", "steps=30", "checkpoint_every=0",
                                     "export_final=false", *switches])
    rows = train(cfg, log=None)
    rewards = [r["reward_mean"] for r in rows]
    print("reward curve:", [round(r, 2) for r in rewards])
    assert len(rows) == 30
    assert _mean(rewards[-5:]) >= _mean(rewards[:5]) + 0.3, rewards
    assert rows[-1]["entropy"] < rows[0]["entropy"]
    if switches:
        assert rows[0]["aem_alpha_max"] > 1.0 and rows[0]["actfocus_weight_reasoning"] == pytest.approx(0.3)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_step"] for r in logged] == list(range(1, 31))


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    common = ["batch_episodes=16", "export_final=false", "algo.aem.enabled=true", "algo.actfocus.enabled=true"]

    def run(name, *extra):
        return train(load(TrainConfig, CONFIG, [f"run_dir={tmp_path / name}", *common, *extra]), log=None)

    straight = run("a", "steps=4", "checkpoint_every=0")
    first = run("b", "steps=2", "checkpoint_every=2")  # stops after a checkpoint at step 2
    second = run("b", "steps=4", "checkpoint_every=2")  # resumes from it
    assert [r["train_step"] for r in first + second] == [1, 2, 3, 4]
    for a, b in zip(straight, first + second, strict=True):
        assert (a["reward_mean"], a["loss"], a["grad_norm"]) == (b["reward_mean"], b["loss"], b["grad_norm"])
    logged = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["train_step"] for line in logged] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.7, 2.3])
def test_kill_9_mid_run_loses_at_most_the_steps_since_the_last_checkpoint(tmp_path, delay_s):
    import os
    import signal
    import subprocess
    import sys
    import time

    from swerl.learner.checkpoint import latest_checkpoint, load_checkpoint

    args = [sys.executable, "-m", "swerl.cli", "train", "--config", CONFIG, f"run_dir={tmp_path}", "steps=200",
            "batch_episodes=16", "checkpoint_every=1", "keep_checkpoints=2", "export_final=false",
            "metrics.progress=false"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while latest_checkpoint(tmp_path) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)  # somewhere inside a later step, checkpoint write or metrics append
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None
    saved = int(load_checkpoint(ckpt)["train_step"])  # loads: the newest checkpoint is never torn
    assert saved >= 1
    # resume for two more steps: rows of steps after the checkpoint are dropped and rewritten
    rows = train(load(TrainConfig, CONFIG, [f"run_dir={tmp_path}", f"steps={saved + 2}", "batch_episodes=16",
                                            "checkpoint_every=1", "export_final=false"]), log=None)
    assert [r["train_step"] for r in rows] == [saved + 1, saved + 2]
    logged = [json.loads(line)["train_step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, saved + 3))
