import math
import statistics

import pytest
import torch

from swerl.algo import dapo_keep_mask, group_advantages, overlong_penalty
from swerl.algo.advantages import group_ids


def naive_advantages(rewards, groups, estimator, eps=1e-6):
    """Python loops over groups, written independently of swerl.algo."""
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        if estimator == "reinforce":
            out.append(r)
        elif len(members) == 1:
            out.append(0.0)
        elif estimator == "grpo":
            out.append((r - statistics.mean(members)) / (statistics.stdev(members) + eps))
        elif estimator == "drgrpo":
            out.append(r - statistics.mean(members))
        elif estimator == "rloo":
            out.append(r - (sum(members) - r) / (len(members) - 1))
    return out


# --- hand-computed cases -------------------------------------------------------------------------


def test_grpo_one_group_by_hand():
    # rewards [1, 0, 0, 1]: mean 0.5, unbiased var = 4·0.25/3 = 1/3, std = sqrt(1/3)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # = 0.8660
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a]))


def test_grpo_eps_is_added_to_std():
    adv = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([5, 5]), eps=0.5)
    # mean 0.5, unbiased std = sqrt((0.25 + 0.25) / 1) = sqrt(0.5)
    a = 0.5 / (math.sqrt(0.5) + 0.5)
    torch.testing.assert_close(adv, torch.tensor([a, -a]))


def test_drgrpo_and_std_normalize_false_by_hand():
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0]), torch.tensor([0, 0, 0, 0, 1])
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0])  # last one is a singleton
    torch.testing.assert_close(group_advantages(rewards, groups, "drgrpo"), expected)
    torch.testing.assert_close(group_advantages(rewards, groups, "grpo", std_normalize=False), expected)
    # the alias ignores std_normalize
    torch.testing.assert_close(group_advantages(rewards, groups, "drgrpo", std_normalize=True), expected)


def test_rloo_by_hand():
    # r=1: others [0, 0, 1] mean 1/3 → 2/3;  r=0: others [1, 0, 1] mean 2/3 → −2/3
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([2, 2, 2, 2]), "rloo")
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_reinforce_is_the_reward():
    rewards = torch.tensor([0.3, -1.0, 2.0])
    adv = group_advantages(rewards, torch.tensor([0, 0, 1]), "reinforce")
    torch.testing.assert_close(adv, rewards)
    assert adv.data_ptr() != rewards.data_ptr()


def test_non_contiguous_unsorted_labels_by_hand():
    # groups: label 7 → [1, 3] (mean 2, std sqrt(2)), label −2 → [0, 10, 5] (mean 5, std 5), label 100 alone
    rewards = torch.tensor([1.0, 0.0, 3.0, 4.0, 10.0, 5.0])
    labels = torch.tensor([7, -2, 7, 100, -2, -2])
    adv = group_advantages(rewards, labels, eps=0.0)
    s2 = math.sqrt(2.0)
    torch.testing.assert_close(adv, torch.tensor([-1 / s2, -1.0, 1 / s2, 0.0, 1.0, 0.0]))


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_singleton_and_all_equal_groups_get_zero(estimator):
    rewards = torch.tensor([5.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, torch.tensor([0, 1, 1, 1]), estimator)
    assert torch.equal(adv, torch.zeros(4))


def test_equal_fp32_rewards_that_do_not_average_exactly_give_zero():
    # 0.1 is not exact in fp32; an fp32 mean of [0.1] * 7 is off by an ulp, and dividing that by
    # (std + eps) with std ~ 1 ulp gives advantages of about −0.0074 (torch.std in fp32)
    rewards = torch.full((7,), 0.1, dtype=torch.float32)
    adv = group_advantages(rewards, torch.zeros(7, dtype=torch.long))
    assert adv.dtype == torch.float32
    assert adv.abs().max().item() < 1e-9


def test_integer_rewards_are_cast_to_float():
    adv = group_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]), "drgrpo")
    assert adv.dtype == torch.get_default_dtype()
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))


def test_empty_batch():
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


# --- equivalence with naive loops -----------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo", "reinforce"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_naive_loops(estimator, seed):
    gen = torch.Generator().manual_seed(seed)
    n = [1, 7, 16, 33][seed]
    rewards = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    rewards[torch.rand(n, generator=gen) < 0.3] = 1.0  # ties, sometimes whole groups
    labels = torch.randint(-5, 6, (n,), generator=gen) * 13  # sparse, negative, unsorted
    got = group_advantages(rewards, labels, estimator)
    expected = naive_advantages(rewards.tolist(), labels.tolist(), estimator)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


# --- DAPO --------------------------------------------------------------------------------------


def test_dapo_keep_mask_by_hand():
    # label 3: [1, 1] all equal → drop; label 9: [0, 1] → keep; label −4: [5] singleton → keep;
    # label 0: [2, 2, 2.5] → keep
    rewards = torch.tensor([1.0, 0.0, 1.0, 5.0, 1.0, 2.0, 2.0, 2.5])
    labels = torch.tensor([3, 9, 3, -4, 9, 0, 0, 0])
    keep = dapo_keep_mask(rewards, labels)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, False, True, True, True, True, True]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dapo_keep_mask_matches_naive(seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (40,), generator=gen).float()
    labels = torch.randint(0, 15, (40,), generator=gen)
    expected = []
    for g in labels.tolist():
        members = [r for r, h in zip(rewards.tolist(), labels.tolist(), strict=True) if h == g]
        expected.append(len(members) == 1 or len(set(members)) > 1)
    assert dapo_keep_mask(rewards, labels).tolist() == expected


def test_overlong_penalty_by_hand():
    # max_len 100, buffer 20: free up to 80, then −(L − 80)/20 · factor
    lengths = torch.tensor([0, 50, 80, 90, 100, 110])
    got = overlong_penalty(lengths, max_len=100, buffer_len=20, factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, 0.0, -0.5, -1.0, -1.5]))
    got = overlong_penalty(lengths.double(), max_len=100, buffer_len=20, factor=2.0)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, 0.0, -1.0, -2.0, -3.0], dtype=torch.float64))


def test_overlong_penalty_buffer_equal_to_max_len():
    # the whole range is the buffer: −L/10
    got = overlong_penalty(torch.tensor([0, 5, 10]), max_len=10, buffer_len=10, factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.5, -1.0]))


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": torch.tensor([1.0, float("nan")])}, "rewards"),
        ({"rewards": torch.ones(2, 2), "group_index": torch.zeros(2, 2, dtype=torch.long)}, "rewards"),
        ({"group_index": torch.tensor([0, 0, 0])}, "group_index"),
        ({"group_index": torch.tensor([0.0, 1.0])}, "group_index"),
        ({"estimator": "ppo"}, "estimator"),
        ({"eps": -1.0}, "eps"),
    ],
)
def test_group_advantages_rejects_bad_input(kwargs, match):
    args = {"rewards": torch.tensor([1.0, 0.0]), "group_index": torch.tensor([0, 0])} | kwargs
    with pytest.raises(ValueError, match=match):
        group_advantages(**args)


def test_dapo_keep_mask_rejects_bad_input():
    with pytest.raises(ValueError, match="rewards"):
        dapo_keep_mask(torch.tensor([float("inf"), 1.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="group_index"):
        dapo_keep_mask(torch.tensor([1.0, 1.0]), torch.tensor([0]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lengths": torch.tensor([3, -1])}, "lengths"),
        ({"buffer_len": 0}, "buffer_len"),
        ({"buffer_len": 101}, "buffer_len"),
        ({"max_len": 0}, "max_len"),
        ({"factor": -1.0}, "factor"),
        ({"lengths": [1, 2]}, "lengths"),
    ],
)
def test_overlong_penalty_rejects_bad_input(kwargs, match):
    args = {"lengths": torch.tensor([10]), "max_len": 100, "buffer_len": 20, "factor": 1.0} | kwargs
    with pytest.raises(ValueError, match=match):
        overlong_penalty(**args)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_group_ids_match_torch_unique(seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(-50, 50, ([0, 1, 9, 200][seed],), generator=gen) * 3
    inverse, counts = group_ids(labels)
    _, expected_inverse, expected_counts = torch.unique(labels, return_inverse=True, return_counts=True)
    assert torch.equal(inverse, expected_inverse)
    assert counts.shape == labels.shape
    assert torch.equal(counts[: expected_counts.numel()], expected_counts)
    assert not counts[expected_counts.numel() :].any()


def test_rewards_error_comes_before_argument_errors():
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.tensor([float("nan"), 1.0]), torch.tensor([0, 0]), "ppo")
    with pytest.raises(ValueError, match="estimator"):
        group_advantages(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), "ppo")
