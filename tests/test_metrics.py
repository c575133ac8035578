"""Metrics: the ActFocus diagnostic (energy ↔ reward-variance correlation across groups), `swerl plot`,
and TensorBoard output of the training loop."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from swerl.cli import main
from swerl.config import load
from swerl.learner.metrics import (
    PLOTS,
    energy_reward_correlation,
    group_energy_reward_stats,
    plot_metrics,
    rank,
)
from swerl.train import TrainConfig, train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# ---- the correlation, by hand ------------------------------------------------------------------------


def test_correlation_hand_computed_three_groups():
    # x = energy [1, 2, 3], y = reward variance [1, 3, 2]
    # means 2 and 2; dx = [-1, 0, 1], dy = [-1, 1, 0]
    # Sxy = 1 + 0 + 0 = 1, Sxx = 1 + 0 + 1 = 2, Syy = 1 + 1 + 0 = 2 → r = 1 / sqrt(2 · 2) = 0.5
    # ranks equal the values → Spearman = 0.5 too (and 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/24 = 0.5)
    pearson, spearman = energy_reward_correlation([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert pearson == pytest.approx(0.5)
    assert spearman == pytest.approx(0.5)


def test_correlation_hand_computed_monotone_nonlinear():
    # x = [1, 2, 3, 4], y = x² = [1, 4, 9, 16]; means 2.5 and 7.5
    # dx = [-1.5, -0.5, 0.5, 1.5], dy = [-6.5, -3.5, 1.5, 8.5]
    # Sxy = 9.75 + 1.75 + 0.75 + 12.75 = 25; Sxx = 2.25 + 0.25 + 0.25 + 2.25 = 5
    # Syy = 42.25 + 12.25 + 2.25 + 72.25 = 129 → r = 25 / sqrt(645)
    # monotone → Spearman = 1
    pearson, spearman = energy_reward_correlation([1.0, 2.0, 3.0, 4.0], [1.0, 4.0, 9.0, 16.0])
    assert pearson == pytest.approx(25 / math.sqrt(645))
    assert spearman == pytest.approx(1.0)
    # negated y: both flip sign
    pearson, spearman = energy_reward_correlation([1.0, 2.0, 3.0, 4.0], [-1.0, -4.0, -9.0, -16.0])
    assert pearson == pytest.approx(-25 / math.sqrt(645))
    assert spearman == pytest.approx(-1.0)


def test_correlation_ties_use_mean_ranks():
    assert rank([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    # x = [1, 2, 3, 4], y = [0, 0, 1, 1] → ranks y = [1.5, 1.5, 3.5, 3.5]
    # dx ranks = [-1.5, -0.5, 0.5, 1.5], dy ranks = [-1, -1, 1, 1]
    # S = 1.5 + 0.5 + 0.5 + 1.5 = 4; Sxx = 5; Syy = 4 → rho = 4 / sqrt(20)
    _, spearman = energy_reward_correlation([1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0])
    assert spearman == pytest.approx(4 / math.sqrt(20))


def test_correlation_undefined_cases_are_nan():
    nan2 = lambda r: all(math.isnan(v) for v in r)  # noqa: E731
    assert nan2(energy_reward_correlation([], []))
    assert nan2(energy_reward_correlation([1.0, 2.0], [0.1, 0.2]))  # fewer than 3 groups
    assert nan2(energy_reward_correlation([1.0, 2.0, 3.0], [0.25, 0.25, 0.25]))  # zero reward-var variance
    assert nan2(energy_reward_correlation([2.0, 2.0, 2.0], [0.1, 0.2, 0.3]))  # zero energy variance
    # a group without action tokens (NaN energy) is dropped: 2 groups left → NaN
    assert nan2(energy_reward_correlation([1.0, float("nan"), 3.0], [0.1, 0.2, 0.3]))
    with pytest.raises(ValueError):
        energy_reward_correlation([1.0, 2.0, 3.0], [1.0, 2.0])


def _textbook(x, y):
    """Independent formulas: the one-pass computational Pearson, and Spearman's 1 − 6Σd²/(n(n²−1))
    (valid without ties) with ranks from sorting."""
    n = len(x)
    sx, sy = sum(x), sum(y)
    sxy = sum(a * b for a, b in zip(x, y, strict=True))
    sxx, syy = sum(a * a for a in x), sum(b * b for b in y)
    r = (n * sxy - sx * sy) / math.sqrt((n * sxx - sx * sx) * (n * syy - sy * sy))
    rx = {i: k + 1 for k, i in enumerate(sorted(range(n), key=lambda i: x[i]))}
    ry = {i: k + 1 for k, i in enumerate(sorted(range(n), key=lambda i: y[i]))}
    d2 = sum((rx[i] - ry[i]) ** 2 for i in range(n))
    return r, 1 - 6 * d2 / (n * (n * n - 1))


def test_correlation_matches_independent_formulas():
    rng = random.Random(0)
    for n in (3, 4, 7, 16, 50):
        x = [rng.gauss(2.0, 1.0) for _ in range(n)]
        y = [abs(rng.gauss(0.0, 0.3)) + 0.1 * xi for xi in x]
        want_p, want_s = _textbook(x, y)
        got_p, got_s = energy_reward_correlation(x, y)
        assert got_p == pytest.approx(want_p, abs=1e-9)
        assert got_s == pytest.approx(want_s, abs=1e-9)


def test_group_energy_reward_stats():
    # 3 groups of 2 episodes, 3 tokens each
    energy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0],   # group 7
                           [5.0, 5.0, 5.0], [6.0, 9.0, 9.0],   # group 3
                           [9.0, 9.0, 9.0], [9.0, 9.0, 9.0]])  # group 5: no action tokens
    action = torch.tensor([[1, 1, 0], [1, 0, 0],
                           [1, 1, 1], [1, 0, 0],
                           [0, 0, 0], [0, 0, 0]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    group = torch.tensor([7, 7, 3, 3, 5, 5])
    energies, variances = group_energy_reward_stats(energy, action, rewards, group)
    # group 7: action energies 1, 2, 3 → 2; rewards [1, 0] → var 0.25
    # group 3: 5, 5, 5, 6 → 5.25; rewards [1, 1] → var 0
    # group 5: none → NaN; rewards [0, 0.5] → var 0.0625
    assert energies[:2] == pytest.approx([2.0, 5.25]) and math.isnan(energies[2])
    assert variances == pytest.approx([0.25, 0.0, 0.0625])


# ---- swerl plot ------------------------------------------------------------------------------------


def _synthetic_run(run_dir, steps=5):
    rows = []
    for s in range(1, steps + 1):
        rows.append({"train_step": s, "reward_mean": 0.1 * s, "reward_shaped_mean": 0.1 * s, "loss": -0.01 * s,
                     "pg_loss": -0.01 * s, "entropy": 2.0 - 0.1 * s, "kl": None, "approx_kl": 1e-4 * s,
                     "grad_norm": 1.0 / s, "action_token_share": 0.4, "energy_action": 3.0 + 0.1 * s,
                     "energy_reasoning": 2.5, "energy_reward_corr_pearson": 0.2 if s > 1 else None,
                     "energy_reward_corr_spearman": 0.3 if s > 1 else None})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"train_st')
    return rows


def test_plot_writes_pngs(tmp_path):
    _synthetic_run(tmp_path / "run")
    files = plot_metrics(tmp_path / "run", tmp_path / "out")
    assert sorted(f.name for f in files) == sorted(f"{stem}.png" for stem in PLOTS)
    for f in files:
        assert f.read_bytes()[:8] == PNG_MAGIC


def test_plot_cli(tmp_path, capsys):
    _synthetic_run(tmp_path)
    assert main(["plot", str(tmp_path)]) == 0
    for stem in ("reward", "loss", "entropy", "kl", "grad_norm", "action_share", "energy", "energy_reward_corr"):
        assert (tmp_path / "plots" / f"{stem}.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_cli_missing_or_empty(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics file" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("")
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no metrics rows" in capsys.readouterr().err


# ---- the training loop: new metrics, TensorBoard ---------------------------------------------------


def test_train_tensorboard_and_actfocus_metrics(tmp_path):
    cfg = load(TrainConfig, "configs/toy_cpu.yaml",
               [f"run_dir={tmp_path}", "steps=2", "batch_episodes=32", "checkpoint_every=0",
                "export_final=false", "metrics.tensorboard=true", "algo.actfocus.enabled=true"])
    rows = train(cfg, log=None)
    assert len(rows) == 2
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    for r in rows:
        assert r["energy_reward_corr_groups"] >= 1
        assert 0.0 < r["action_token_share"] < 1.0
        assert r["energy_action"] == r["energy_action"]  # not NaN: the reference pass ran
        assert r["actfocus_weight_min"] == pytest.approx(0.3)  # reasoning tokens weigh alpha
        assert 1.0 <= r["actfocus_weight_max"] <= 1.5  # actions: 1 + beta·sigmoid(.)
        p = r["energy_reward_corr_pearson"]
        assert math.isnan(p) or -1.0 <= p <= 1.0
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "energy_reward_corr_spearman" in logged[0]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1, 2]


def test_tensorboard_off_by_default(tmp_path):
    cfg = load(TrainConfig, "configs/toy_cpu.yaml",
               [f"run_dir={tmp_path}", "steps=1", "batch_episodes=8", "checkpoint_every=0", "export_final=false"])
    assert cfg.metrics.tensorboard is False
    rows = train(cfg, log=None)
    assert not (tmp_path / "tensorboard").exists()
    assert math.isnan(rows[0]["energy_reward_corr_pearson"]) and rows[0]["energy_reward_corr_groups"] == 0
    assert rows[0]["actfocus_weight_min"] == rows[0]["actfocus_weight_max"] == 1.0
