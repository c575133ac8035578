"""Importance weights between the engine's and the learner's log-probs (swerl.algo.offpolicy):
hand-computed cases, and the vectorised version against a naive loop in float64."""

from __future__ import annotations

import math

import pytest
import torch

from swerl.algo.offpolicy import importance_weights, is_metrics

L = math.log


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def close(x, rows):
    """float64 throughout: exp/log of these ratios are exact to ~1e-15; 1e-12 leaves room."""
    return torch.allclose(x, t(rows), rtol=0, atol=1e-12)


# learner / engine probabilities of 3 tokens in row 0, 2 in row 1 (the last position is padding)
LEARNER = t([[L(0.5), L(0.2), L(0.3)], [L(0.9), L(0.1), 0.0]])
ENGINE = t([[L(0.25), L(0.4), L(0.3)], [L(0.3), L(0.1), 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# r = learner / engine: row 0 → 2, 0.5, 1; row 1 → 3, 1


def test_truncated_token_weights_cap_each_ratio():
    w = importance_weights(LEARNER, ENGINE, MASK, level="token", mode="truncate", cap=1.5)
    assert close(w.ratio, [[2.0, 0.5, 1.0], [3.0, 1.0, 1.0]])
    assert close(w.weights, [[1.5, 0.5, 1.0], [1.5, 1.0, 0.0]])
    assert w.kept.tolist() == [[True, True, True], [True, True, False]]
    assert w.capped.tolist() == [[True, False, False], [True, False, False]]


def test_masked_token_weights_drop_ratios_outside_the_range():
    w = importance_weights(LEARNER, ENGINE, MASK, level="token", mode="mask", cap=2.5)  # lower 1/2.5 = 0.4
    assert close(w.weights, [[2.0, 0.5, 1.0], [0.0, 1.0, 0.0]])
    assert w.kept.tolist() == [[True, True, True], [False, True, False]]
    w = importance_weights(LEARNER, ENGINE, MASK, level="token", mode="mask", cap=2.5, lower=0.6)
    assert w.kept.tolist() == [[True, False, True], [False, True, False]]


def test_sequence_and_geometric_ratios_are_one_per_sequence():
    # row 0: product 2·0.5·1 = 1 (geometric 1); row 1: product 3·1 = 3 (geometric √3)
    w = importance_weights(LEARNER, ENGINE, MASK, level="sequence", mode="truncate", cap=2.0)
    assert close(w.ratio, [[1.0, 1.0, 1.0], [3.0, 3.0, 1.0]])
    assert close(w.weights, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    w = importance_weights(LEARNER, ENGINE, MASK, level="geometric", mode="mask", cap=1.5)
    assert w.ratio[1, :2].tolist() == pytest.approx([math.sqrt(3)] * 2, abs=1e-12)
    assert w.kept.tolist() == [[True, True, True], [False, False, False]]  # √3 > 1.5: the whole row goes


def test_metrics_by_hand():
    w = importance_weights(LEARNER, ENGINE, MASK, level="token", mode="truncate", cap=1.5)
    m = is_metrics(w, LEARNER, ENGINE, MASK)
    logs = [L(2), L(0.5), 0.0, L(3), 0.0]
    assert m.ratio_mean == pytest.approx((2 + 0.5 + 1 + 3 + 1) / 5, abs=1e-12)
    assert (m.ratio_max, m.capped_fraction) == (pytest.approx(3.0, abs=1e-12), pytest.approx(2 / 5))
    assert m.mismatch_k1 == pytest.approx(-sum(logs) / 5, abs=1e-12)
    assert m.mismatch_k3 == pytest.approx(sum(math.exp(x) - 1 - x for x in logs) / 5, abs=1e-12)
    ws = importance_weights(LEARNER, ENGINE, MASK, level="sequence", mode="mask", cap=2.0)
    ms = is_metrics(ws, LEARNER, ENGINE, MASK, level="sequence")
    assert (ms.ratio_mean, ms.ratio_max, ms.capped_fraction) == (pytest.approx(2.0), pytest.approx(3.0), 0.5)


def test_equal_log_probs_give_weight_one_and_zero_mismatch():
    w = importance_weights(LEARNER, LEARNER.clone(), MASK, mode="mask", cap=1.0)
    assert w.weights.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    m = is_metrics(w, LEARNER, LEARNER, MASK)
    assert (m.mismatch_k1, m.mismatch_k3, m.capped_fraction) == (0.0, 0.0, 0.0)


def test_weights_are_constants_of_the_loss_and_padding_cannot_leak():
    learner = LEARNER.clone().requires_grad_(True)
    engine = ENGINE.clone()
    engine[1, 2] = float("nan")  # garbage on padding
    w = importance_weights(learner, engine, MASK, level="sequence", cap=5.0)
    assert not w.weights.requires_grad and torch.isfinite(w.weights).all()


def naive(learner, engine, mask, level, mode, cap, lower):
    B, T = learner.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        idx = [j for j in range(T) if mask[b, j]]
        logs = [float(learner[b, j] - engine[b, j]) for j in idx]
        for k, j in enumerate(idx):
            if level == "token":
                lr = logs[k]
            elif level == "sequence":
                lr = sum(logs)
            else:
                lr = sum(logs) / len(logs)
            r = math.exp(max(-20.0, min(20.0, lr)))
            if mode == "truncate":
                out[b, j] = min(r, cap)
            else:
                out[b, j] = r if lower <= r <= cap else 0.0
    return out


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_matches_a_naive_loop(level, mode):
    g = torch.Generator().manual_seed(7)
    learner = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    engine = learner + torch.randn(6, 9, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(6, 9, generator=g) > 0.3
    mask[2] = False  # a row with nothing to train on
    w = importance_weights(learner, engine, mask, level=level, mode=mode, cap=1.3, lower=0.8)
    assert torch.allclose(w.weights, naive(learner, engine, mask, level, mode, 1.3, 0.8), rtol=1e-12, atol=0)


@pytest.mark.parametrize("kw, says", [
    (dict(cap=0.5), "cap must be >= 1.0"),
    (dict(lower=1.5), "lower must be <= 1.0"),
    (dict(level="row"), "level must be one of"),
    (dict(mode="clip"), "mode must be one of"),
])
def test_bad_arguments_are_named(kw, says):
    with pytest.raises(ValueError, match=says):
        importance_weights(LEARNER, ENGINE, MASK, **kw)
