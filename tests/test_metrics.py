"""Metrics: the ActFocus diagnostic (energy ↔ reward-variance correlation across groups) and TensorBoard
output of the training loop. (`swerl plot` / `swerl compare`: tests/test_runlog.py.)"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from swerl.algo.diagnostics import (
    energy_reward_correlation,
    group_energy_reward_stats,
    rank,
)
from swerl.config import load
from swerl.train import TrainConfig, train

METRIC_GROUPS = ("actor", "reward", "rollout", "async", "aem", "actfocus", "timing_s", "val")
"""The prefixes of every metric name (a name is `<group>/<metric>`)."""

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


def test_group_energies_split_action_and_reasoning_and_pool_across_ranks():
    from swerl.algo.diagnostics import GroupEnergies, group_energies, merge_group_energies

    energy = torch.tensor([[1.0, 2.0, 4.0], [3.0, 8.0, 0.0],    # group 0
                           [5.0, 5.0, 2.0], [6.0, 7.0, 7.0]])   # group 1
    action = torch.tensor([[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    reasoning = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 0, 1], [0, 1, 1]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    g = group_energies(energy, action, reasoning, rewards, torch.tensor([0, 0, 1, 1]))
    # group 0: action 1, 3 → 2; reasoning 2, 4, 8 → 14/3; rewards [1, 0] → var 0.25
    # group 1: action 5, 5, 6 → 16/3; reasoning 2, 7, 7 → 16/3; rewards [1, 1] → var 0
    assert g.action == pytest.approx((2.0, 16 / 3)) and g.reasoning == pytest.approx((14 / 3, 16 / 3))
    assert g.reward_var == (0.25, 0.0)
    merged = merge_group_energies([g, GroupEnergies((1.0,), (9.0,), (0.1,))])
    assert merged.action == pytest.approx((2.0, 16 / 3, 1.0)) and merged.reward_var == (0.25, 0.0, 0.1)
    # over these three groups: action energies 2, 5.33, 1 against variances 0.25, 0, 0.1: Pearson
    # computed by hand from the centred sums (x̄ = 25/9, ȳ = 0.35/3)
    x, y = (2.0, 16 / 3, 1.0), (0.25, 0.0, 0.1)
    mx, my = sum(x) / 3, sum(y) / 3
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    want = sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))
    c = merged.correlations()
    assert c["action_pearson"] == pytest.approx(want, abs=1e-12)
    assert c["action_spearman"] == pytest.approx(-0.5)  # ranks (2, 3, 1) vs (3, 1, 2): 1 - 6·6/24
    with pytest.raises(ValueError, match="one entry per group"):
        GroupEnergies((1.0,), (), (0.0,))


def test_correlation_confidence_interval_is_fishers():
    from swerl.algo.diagnostics import correlation_ci

    # r = 0.5 over 28 pairs: atanh(0.5) = 0.549306, ± 1.959964 / sqrt(25) = 0.391993 → tanh(0.157313)
    # = 0.156028 and tanh(0.941299) = 0.735818
    lo, hi = correlation_ci(0.5, 28)
    assert lo == pytest.approx(0.156028, abs=1e-6) and hi == pytest.approx(0.735818, abs=1e-6)
    assert all(math.isnan(v) for v in correlation_ci(0.5, 3) + correlation_ci(float("nan"), 50))


def test_measure_logs_the_energy_diagnostic_with_actfocus_off(tmp_path):
    cfg = load(TrainConfig, "configs/toy_cpu.yaml",
               [f"run_dir={tmp_path}", "steps=1", "batch_episodes=16", "group_size=4", "checkpoint_every=0",
                "export_final=false", "algo.actfocus.measure=true"])
    (row,) = train(cfg, log=None)
    assert row["actfocus/weight_action"] == row["actfocus/weight_reasoning"] == 1.0  # ActFocus is off
    assert math.isfinite(row["actfocus/energy_action"]) and math.isfinite(row["actfocus/energy_reasoning"])
    groups = row["actfocus/group_reward_var"]
    assert len(groups) == len(row["actfocus/group_energy_action"])
    assert len(groups) == len(row["actfocus/group_energy_reasoning"])
    assert 1 <= len(groups) <= 4 and all(v >= 0.0 for v in groups)
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert len(logged["actfocus/group_energy_action"]) == len(groups)


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
        assert r["actfocus/energy_reward_corr_groups"] >= 1
        assert 0.0 < r["actfocus/action_token_share"] < 1.0
        assert r["actfocus/energy_action"] == r["actfocus/energy_action"]  # not NaN: the reference pass ran
        # reasoning tokens weigh alpha (float32 0.3)
        assert r["actfocus/weight_min"] == pytest.approx(0.3, rel=1e-6)
        assert 1.0 <= r["actfocus/weight_max"] <= 1.5  # actions: 1 + beta·sigmoid(.)
        p = r["actfocus/energy_reward_corr_pearson"]
        assert math.isnan(p) or -1.0 <= p <= 1.0
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "actfocus/energy_reward_corr_spearman" in logged[0]
    # every metric is named <group>/<metric>, in the groups docs/metrics.md explains
    assert all(k == "train_step" or k.split("/")[0] in METRIC_GROUPS for r in logged for k in r), logged[0]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]


def test_tensorboard_off_by_default(tmp_path):
    cfg = load(TrainConfig, "configs/toy_cpu.yaml",
               [f"run_dir={tmp_path}", "steps=1", "batch_episodes=8", "checkpoint_every=0",
                "export_final=false"])
    assert cfg.metrics.tensorboard is False
    rows = train(cfg, log=None)
    assert not (tmp_path / "tensorboard").exists()
    assert (math.isnan(rows[0]["actfocus/energy_reward_corr_pearson"])
            and rows[0]["actfocus/energy_reward_corr_groups"] == 0)
    assert rows[0]["actfocus/weight_min"] == rows[0]["actfocus/weight_max"] == 1.0


def test_every_metric_name_is_grouped_and_documented():
    import dataclasses
    import re
    from pathlib import Path

    from swerl.learner.metrics import UpdateMetrics
    from swerl.runlog import UPDATE_METRICS, grouped_update_metrics

    fields = {f.name for f in dataclasses.fields(UpdateMetrics)}
    assert set(UPDATE_METRICS) == fields  # a new field must get a name
    with pytest.raises(KeyError, match="new_thing"):
        grouped_update_metrics({"loss": 1.0, "new_thing": 2.0})
    assert grouped_update_metrics({"loss": 1.0, "aem_alpha_max": 2.0}) == {"actor/loss": 1.0,
                                                                           "aem/alpha_max": 2.0}
    # the loop's own names (rollout/, reward/, timing_s/, val/) as train.py and swerl/eval spell them
    src = Path("swerl/train.py").read_text() + "".join(p.read_text()
                                                       for p in sorted(Path("swerl/eval").glob("*.py")))
    loop_names = set(re.findall(r'"((?:rollout|reward|timing_s|val)/[a-z_@{}j]+)"', src))
    doc = Path("docs/metrics.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+/[a-z0-9_@k]+)`", doc, flags=re.M))
    names = set(UPDATE_METRICS.values()) | {n.replace("{j}", "k") for n in loop_names}
    assert names <= documented, sorted(names - documented)
    assert {n.split("/")[0] for n in documented} <= set(METRIC_GROUPS)
