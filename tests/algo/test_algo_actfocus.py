import math

import pytest
import torch

from swerl.algo import actfocus_weights


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def naive_weights(energy, span, mask, alpha, beta, eps=1e-6):
    actions = [
        energy[b][t] for b in range(len(span)) for t in range(len(span[b])) if mask[b][t] and span[b][t] == 2
    ]
    n = len(actions)
    mu = sum(actions) / n if n else 0.0
    sigma = math.sqrt(sum((e - mu) ** 2 for e in actions) / n) if n else 0.0  # population std
    out = []
    for b in range(len(span)):
        row = []
        for t in range(len(span[b])):
            if not mask[b][t] or span[b][t] == 0:
                row.append(0.0)
            elif span[b][t] == 1:
                row.append(alpha)
            else:
                z = (energy[b][t] - mu) / (sigma + eps) if n >= 2 else 0.0
                row.append(1.0 + beta * sigmoid(z))
        out.append(row)
    return out


# --- hand-computed cases -------------------------------------------------------------------------


def test_weights_by_hand():
    energy = torch.tensor([[5.0, 1.0, 9.0, 2.0], [3.0, 7.0, -4.0, 8.0]])
    span = torch.tensor([[0, 2, 1, 2], [2, 1, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 1]])  # the action at (1, 2) is masked out
    w = actfocus_weights(energy, span, mask, alpha=0.3, beta=0.5, eps=0.0)
    # action energies [1, 2, 3]: μ = 2, population σ = sqrt((1 + 0 + 1)/3) = sqrt(2/3) = 0.8165
    s = math.sqrt(2 / 3)
    lo, mid, hi = (1 + 0.5 * sigmoid(-1 / s), 1 + 0.5 * 0.5, 1 + 0.5 * sigmoid(1 / s))  # 1.1135, 1.25, 1.3865
    expected = torch.tensor([[0.0, lo, 0.3, mid], [hi, 0.3, 0.0, 0.0]])
    torch.testing.assert_close(w, expected)


def test_sigma_is_the_population_std():
    # two action tokens [0, 2]: population σ = 1 → z = ±1 (the unbiased σ = sqrt(2) would give ±0.707)
    w = actfocus_weights(
        torch.tensor([[0.0, 2.0]]), torch.tensor([[2, 2]]), torch.ones(1, 2), 0.0, 1.0, eps=0.0
    )
    torch.testing.assert_close(w, torch.tensor([[1 + sigmoid(-1.0), 1 + sigmoid(1.0)]]))


def test_no_action_tokens():
    span = torch.tensor([[1, 1, 0], [0, 1, 1]])
    w = actfocus_weights(torch.randn(2, 3), span, torch.ones(2, 3), alpha=0.1, beta=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.1, 0.1, 0.0], [0.0, 0.1, 0.1]]))


def test_one_action_token_weighs_one_plus_half_beta():
    span = torch.tensor([[1, 2, 2]])
    mask = torch.tensor([[1, 1, 0]])  # only one action token under the mask
    w = actfocus_weights(torch.tensor([[0.0, 123.0, -50.0]]), span, mask, alpha=0.2, beta=0.6)
    torch.testing.assert_close(w, torch.tensor([[0.2, 1.3, 0.0]]))


def test_equal_action_energies_weigh_one_plus_half_beta():
    w = actfocus_weights(
        torch.full((2, 3), 4.2), torch.full((2, 3), 2), torch.ones(2, 3), alpha=0.5, beta=1.0
    )
    torch.testing.assert_close(w, torch.full((2, 3), 1.5))


def test_empty_mask_gives_zero_weights():
    w = actfocus_weights(torch.randn(2, 4), torch.full((2, 4), 2), torch.zeros(2, 4), alpha=0.5, beta=1.0)
    assert torch.equal(w, torch.zeros(2, 4))


def test_non_action_energy_is_not_read():
    energy = torch.tensor([[float("nan"), 1.0, 3.0, float("inf")]])
    span = torch.tensor([[1, 2, 2, 2]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = actfocus_weights(energy, span, mask, alpha=0.4, beta=1.0, eps=0.0)
    torch.testing.assert_close(w, torch.tensor([[0.4, 1 + sigmoid(-1.0), 1 + sigmoid(1.0), 0.0]]))


def test_weights_carry_no_gradient():
    energy = torch.randn(2, 3, requires_grad=True)
    assert not actfocus_weights(energy, torch.full((2, 3), 2), torch.ones(2, 3), 0.5, 1.0).requires_grad


# --- equivalence with naive loops -----------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize(
    ("seed", "shape"), [(0, (1, 5)), (1, (3, 17)), (2, (8, 64)), (3, (2, 2)), (4, (1, 3))]
)
def test_matches_naive(seed, shape, eps):
    gen = torch.Generator().manual_seed(seed)
    energy = torch.randn(shape, generator=gen, dtype=torch.float64) * 4 - 10
    span = torch.randint(0, 3, shape, generator=gen)
    mask = torch.rand(shape, generator=gen) < [0.8, 0.8, 0.8, 0.8, 0.4][seed]  # seed 4: < 2 actions
    w = actfocus_weights(energy, span, mask, alpha=0.3, beta=0.7, eps=eps)
    expected = naive_weights(energy.tolist(), span.tolist(), mask.tolist(), 0.3, 0.7, eps)
    torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64))


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"span": torch.tensor([[0, 3]])}, "span"),
        ({"span": torch.tensor([[0, 2, 1]])}, "span"),
        ({"span": torch.tensor([[0.0, 2.0]])}, "span"),
        ({"mask": torch.ones(2, 2)}, "mask"),
        ({"energy": torch.tensor([[0.0, float("nan")]])}, "energy"),
        ({"energy": torch.tensor([0.0, 1.0])}, "energy"),
        ({"alpha": -0.1}, "alpha"),
        ({"beta": float("nan")}, "beta"),
        ({"eps": -1.0}, "eps"),
    ],
)
def test_rejects_bad_input(kwargs, match):
    args = {
        "energy": torch.tensor([[0.0, 1.0]]),
        "span": torch.tensor([[1, 2]]),
        "mask": torch.ones(1, 2),
        "alpha": 0.5,
        "beta": 1.0,
    } | kwargs
    with pytest.raises(ValueError, match=match):
        actfocus_weights(**args)


def test_span_error_comes_before_energy_error():
    with pytest.raises(ValueError, match="span"):
        actfocus_weights(
            torch.tensor([[float("nan"), 1.0]]), torch.tensor([[2, 5]]), torch.ones(1, 2), 0.5, 1.0
        )
