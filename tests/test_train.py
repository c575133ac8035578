"""The training loop end to end on CPU: a tiny random-init model learns the toy multi-turn game
(swerl/envs/toy/) with plain GRPO and with AEM + ActFocus; runs resume exactly."""

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
    rewards = [r["reward/mean"] for r in rows]
    print("reward curve:", [round(r, 2) for r in rewards])
    assert len(rows) == 30
    assert _mean(rewards[-5:]) >= _mean(rewards[:5]) + 0.3, rewards
    assert rows[-1]["actor/entropy"] < rows[0]["actor/entropy"]
    if switches:
        assert rows[0]["aem/alpha_max"] > 1.0 and rows[0]["actfocus/weight_reasoning"] == pytest.approx(
            0.3, rel=rows[0]["actor/tokens"] * 2**-24)  # a float32 mean of N equal weights
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_step"] for r in logged] == list(range(1, 31))


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    common = ["batch_episodes=16", "export_final=false", "algo.aem.enabled=true",
              "algo.actfocus.enabled=true"]

    def run(name, *extra):
        return train(load(TrainConfig, CONFIG, [f"run_dir={tmp_path / name}", *common, *extra]), log=None)

    straight = run("a", "steps=4", "checkpoint_every=0")
    first = run("b", "steps=2", "checkpoint_every=2")  # stops after a checkpoint at step 2
    second = run("b", "steps=4", "checkpoint_every=2")  # resumes from it
    assert [r["train_step"] for r in first + second] == [1, 2, 3, 4]
    for a, b in zip(straight, first + second, strict=True):
        keys = ("reward/mean", "actor/loss", "actor/grad_norm")
        assert [a[k] for k in keys] == [b[k] for k in keys]
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

    args = [sys.executable, "-m", "swerl.cli", "train", "--config", CONFIG, f"run_dir={tmp_path}",
            "steps=200", "batch_episodes=16", "checkpoint_every=1", "keep_checkpoints=2",
            "export_final=false", "metrics.progress=false"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while latest_checkpoint(tmp_path) is None and time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before its first checkpoint"
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
    logged = [json.loads(line)["train_step"]
              for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, saved + 3))


def test_eval_during_training_logs_val_metrics_without_changing_what_training_samples(tmp_path):
    common = ["steps=3", "batch_episodes=16", "checkpoint_every=0", "export_final=false",
              "metrics.progress=false"]
    plain = train(load(TrainConfig, CONFIG, [f"run_dir={tmp_path / 'plain'}", *common, "eval_every=0"]),
                  log=None)
    rows = train(load(TrainConfig, CONFIG, [f"run_dir={tmp_path / 'eval'}", *common, "eval_every=2",
                                            "eval.k=4"]), log=None)
    # eval_every=2 over 3 steps: step 2, and the last step always
    assert [("val/success_rate" in r) for r in rows] == [False, True, True]
    for r in rows[1:]:
        # toy: every cue (3) k=4 times; success is over the 12 episodes, so a multiple of 1/12
        assert r["val/episodes"] == 12 and r["val/failed"] == 0
        assert abs(r["val/success_rate"] * 12 - round(r["val/success_rate"] * 12)) < 1e-9
        assert r["val/pass@1"] == pytest.approx(r["val/success_rate"], abs=1e-12)  # pass@1 = mean success
        assert r["val/pass@1"] <= r["val/pass@2"] <= r["val/pass@4"] <= 1.0
        assert r["val/reward_mean"] == pytest.approx(r["val/success_rate"], abs=1e-12)  # toy reward is 1 / 0
        assert 1 <= r["val/turns_mean"] <= 3 and r["timing_s/eval"] > 0
        assert (tmp_path / "eval" / "eval" / f"step_{r['train_step']:08d}" / "report.json").is_file()
    # the engine samples evaluation episodes with eval.seed and restores training's stream after
    for a, b in zip(plain, rows, strict=True):
        assert (a["reward/mean"], a["actor/loss"]) == (b["reward/mean"], b["actor/loss"])
    # the same eval.seed on the same weights gives the same evaluation
    again = train(load(TrainConfig, CONFIG, [f"run_dir={tmp_path / 'again'}", *common, "eval_every=2",
                                             "eval.k=4"]), log=None)
    assert [r.get("val/success_rate") for r in again] == [r.get("val/success_rate") for r in rows]


def test_resuming_another_experiment_is_refused_before_anything_is_written(tmp_path):
    from swerl.config import ConfigError

    base = [f"run_dir={tmp_path}", "steps=1", "batch_episodes=8", "checkpoint_every=1", "export_final=false",
            "eval_every=0"]
    train(load(TrainConfig, CONFIG, base), log=None)
    saved = (tmp_path / "config.yaml").read_text()
    metrics = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError) as e:
        train(load(TrainConfig, CONFIG, [*base, "steps=2", "algo.aem.enabled=true", "env.toy.num_cues=4"]),
              log=None)
    msg = str(e.value)
    assert "\n" not in msg and "algo.aem.enabled, env.toy.num_cues" in msg and "--force-resume" in msg
    assert "algo.aem.enabled: False → True" in msg and "env.toy.num_cues: 3 → 4" in msg
    assert ((tmp_path / "config.yaml").read_text() == saved
            and (tmp_path / "metrics.jsonl").read_text() == metrics)
    # budgets and logging may change on resume; a forced resume with another algorithm continues the run
    rows = train(load(TrainConfig, CONFIG, [*base, "steps=2", "optim.lr=1e-3"]), log=None)
    assert [r["train_step"] for r in rows] == [2]
    rows = train(load(TrainConfig, CONFIG, [*base, "steps=3", "algo.aem.enabled=true"]), log=None,
                 force_resume=True)
    assert ([r["train_step"] for r in rows] == [3]
            and "enabled: true" in (tmp_path / "config.yaml").read_text())


def test_every_shipped_config_has_its_own_run_dir():
    from pathlib import Path

    dirs = {p.name: load(TrainConfig, p).run_dir for p in sorted(Path("configs").glob("*.yaml"))
            if p.name != "sandbox_default.yaml"}
    assert len(dirs) >= 10 and len(set(dirs.values())) == len(dirs), dirs


def test_warm_sandboxes_counts_at_most_max_episodes_and_is_never_negative():
    from swerl.config import ConfigError

    assert load(TrainConfig, None, []).rollout.warm == 8  # max_episodes 8: one whole wave made ahead
    assert load(TrainConfig, None, ["rollout.max_episodes=2"]).rollout.warm == 2  # more could never be used
    assert load(TrainConfig, None, ["rollout.warm_sandboxes=0"]).rollout.warm == 0  # off: the old behaviour
    with pytest.raises(ConfigError, match="warm_sandboxes must be >= 0"):
        load(TrainConfig, None, ["rollout.warm_sandboxes=-1"])
