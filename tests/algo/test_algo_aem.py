import math

import pytest
import torch

from swerl.algo import (
    ResponseEntropy,
    aem_advantages,
    aem_coefficients,
    aem_token_advantages,
    response_mean_entropy,
)


def naive_alpha(entropies, groups, lam):
    out = []
    for h, g in zip(entropies, groups, strict=True):
        members = [x for x, k in zip(entropies, groups, strict=True) if k == g]
        lo, hi = min(members), max(members)

        def norm(x, lo=lo, hi=hi):
            return (x - lo) / (hi - lo) if hi > lo else 0.0

        mean = sum(math.exp(-lam * norm(x)) for x in members) / len(members)
        out.append(math.exp(-lam * norm(h)) / mean)
    return out


def naive_responses(token_entropy, turn_index, mask):
    sums, counts = {}, {}
    for b in range(len(mask)):
        for t in range(len(mask[b])):
            if mask[b][t]:
                key = (b, turn_index[b][t])
                sums[key] = sums.get(key, 0.0) + token_entropy[b][t]
                counts[key] = counts.get(key, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}


def random_batch(seed, batch, length, groups):
    gen = torch.Generator().manual_seed(seed)
    ent = torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    # turns grow along each row; mask off some tokens (prompt/observations) and padding at the end
    turn = torch.cumsum(torch.rand(batch, length, generator=gen) < 0.2, dim=1)
    mask = torch.rand(batch, length, generator=gen) < 0.7
    turn = torch.where(mask, turn, -1)
    adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    episode_group = torch.randint(0, groups, (batch,), generator=gen) * 7 - 3
    return ent, turn, mask, adv, episode_group


# --- hand-computed cases -------------------------------------------------------------------------

ENT = torch.tensor([[9.0, 1.0, 3.0, 9.0, 4.0, 6.0], [2.0, 8.0, 7.0, 5.0, 0.0, 0.0]])
TURN = torch.tensor([[-1, 0, 0, -1, 1, 1], [0, 0, 3, 3, 99, -1]])
MASK = torch.tensor([[0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 0, 0]])


def test_response_mean_entropy_by_hand():
    res = response_mean_entropy(ENT, TURN, MASK)
    # (0, 0): (1 + 3)/2 = 2; (0, 1): (4 + 6)/2 = 5; (1, 0): (2 + 8)/2 = 5; (1, 3): (7 + 5)/2 = 6;
    # the 99 and the 9s sit under mask 0
    assert isinstance(res, ResponseEntropy)
    torch.testing.assert_close(res.entropy, torch.tensor([2.0, 5.0, 5.0, 6.0]))
    assert res.episode.tolist() == [0, 0, 1, 1]
    assert res.turn.tolist() == [0, 1, 0, 3]


def test_aem_coefficients_by_hand():
    # H̄ = [0.2, 0.6, 1.0] → H̃ = [0, 0.5, 1]; λ = 1: e = [1, e^−0.5, e^−1], α = e / mean(e)
    alpha = aem_coefficients(torch.tensor([0.2, 0.6, 1.0]), torch.tensor([0, 0, 0]), lam=1.0)
    e = [1.0, math.exp(-0.5), math.exp(-1.0)]
    m = sum(e) / 3  # 0.65814
    torch.testing.assert_close(alpha, torch.tensor([x / m for x in e]))  # [1.5194, 0.9216, 0.5590]
    assert alpha[0] > 1 > alpha[2]  # confident responses get amplified


def test_aem_coefficients_degenerate_groups():
    # group 4: all equal → 1; group 8: one response → 1; group 1: two responses, λ = 0 → 1
    alpha = aem_coefficients(torch.tensor([0.7, 0.7, 0.7, 3.0]), torch.tensor([4, 4, 4, 8]), lam=2.0)
    assert torch.equal(alpha, torch.ones(4))
    alpha = aem_coefficients(torch.tensor([0.1, 0.9]), torch.tensor([1, 1]), lam=0.0)
    assert torch.equal(alpha, torch.ones(2))


def test_aem_token_advantages_by_hand():
    res = response_mean_entropy(ENT, TURN, MASK)
    alpha = torch.tensor([1.5, 0.5, 1.0, 0.8])  # for (0,0), (0,1), (1,0), (1,3)
    got = aem_token_advantages(torch.tensor([2.0, -1.0]), alpha, res, TURN, MASK)
    expected = torch.tensor([[0.0, 3.0, 3.0, 0.0, 1.0, 1.0], [-1.0, -1.0, -0.8, -0.8, 0.0, 0.0]])
    torch.testing.assert_close(got, expected)


def test_aem_advantages_groups_responses_of_all_episodes_in_a_group():
    # both episodes in group 4: the 4 responses [2, 5, 5, 6] are normalised together → H̃ = [0, .75, .75, 1]
    tok_adv, alpha = aem_advantages(torch.tensor([2.0, -1.0]), torch.tensor([4, 4]), ENT, TURN, MASK, lam=2.0)
    e = [math.exp(-2.0 * x) for x in (0.0, 0.75, 0.75, 1.0)]
    expected_alpha = [x / (sum(e) / 4) for x in e]
    torch.testing.assert_close(alpha, torch.tensor(expected_alpha))
    a00, a01, a10, a13 = expected_alpha
    expected = torch.tensor(
        [[0, 2 * a00, 2 * a00, 0, 2 * a01, 2 * a01], [-a10, -a10, -a13, -a13, 0, 0]], dtype=torch.float32
    )
    torch.testing.assert_close(tok_adv, expected)
    # in separate groups each episode is normalised on its own: episode 0 → H̃ [0, 1]
    _, alpha = aem_advantages(torch.tensor([2.0, -1.0]), torch.tensor([0, 1]), ENT, TURN, MASK, lam=2.0)
    m0 = (1 + math.exp(-2.0)) / 2
    torch.testing.assert_close(
        alpha, torch.tensor([1 / m0, math.exp(-2.0) / m0, 1 / m0, math.exp(-2.0) / m0])
    )


def test_empty_mask_gives_no_responses_and_zero_advantages():
    mask = torch.zeros(2, 6, dtype=torch.bool)
    res = response_mean_entropy(ENT, TURN, mask)
    assert res.entropy.numel() == res.episode.numel() == res.turn.numel() == 0
    alpha = aem_coefficients(res.entropy, torch.zeros(0, dtype=torch.long), lam=1.0)
    got = aem_token_advantages(torch.tensor([1.0, 1.0]), alpha, res, TURN, mask)
    assert torch.equal(got, torch.zeros(2, 6))


def test_alpha_carries_no_gradient():
    ent = torch.tensor([0.2, 0.6], requires_grad=True)
    assert not aem_coefficients(ent, torch.tensor([0, 0]), lam=1.0).requires_grad


# --- equivalence with naive loops -----------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_aem_coefficients_match_naive_and_average_one(seed):
    gen = torch.Generator().manual_seed(seed)
    n = [1, 5, 30, 64][seed]
    ent = torch.rand(n, generator=gen, dtype=torch.float64)
    ent[torch.rand(n, generator=gen) < 0.2] = 0.5  # ties
    groups = torch.randint(-3, 4, (n,), generator=gen) * 11
    lam = [0.5, 1.0, 3.0, 10.0][seed]
    alpha = aem_coefficients(ent, groups, lam)
    torch.testing.assert_close(
        alpha, torch.tensor(naive_alpha(ent.tolist(), groups.tolist(), lam), dtype=torch.float64)
    )
    for g in groups.unique():
        assert alpha[groups == g].mean().item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(("seed", "batch", "length"), [(0, 1, 7), (1, 4, 20), (2, 8, 33)])
def test_full_aem_matches_naive(seed, batch, length):
    ent, turn, mask, adv, episode_group = random_batch(seed, batch, length, groups=3)
    responses = naive_responses(ent.tolist(), turn.tolist(), mask.tolist())
    keys = sorted(responses)
    alphas = naive_alpha([responses[k] for k in keys], [episode_group[b].item() for b, _ in keys], lam=1.5)
    alpha_of = dict(zip(keys, alphas, strict=True))
    expected = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            if mask[b, t]:
                expected[b, t] = alpha_of[(b, turn[b, t].item())] * adv[b].item()

    res = response_mean_entropy(ent, turn, mask)
    assert list(zip(res.episode.tolist(), res.turn.tolist(), strict=True)) == keys
    torch.testing.assert_close(res.entropy, torch.tensor([responses[k] for k in keys], dtype=torch.float64))
    tok_adv, alpha = aem_advantages(adv, episode_group, ent, turn, mask, lam=1.5)
    torch.testing.assert_close(alpha, torch.tensor(alphas, dtype=torch.float64))
    torch.testing.assert_close(tok_adv, expected)


# --- bad input ---------------------------------------------------------------------------------


def test_response_mean_entropy_rejects_bad_input():
    with pytest.raises(ValueError, match="turn_index"):
        response_mean_entropy(ENT, TURN[:, :5], MASK)
    with pytest.raises(ValueError, match="mask"):
        response_mean_entropy(ENT, TURN, MASK[:1])
    with pytest.raises(ValueError, match="turn_index"):  # a masked token without a turn
        response_mean_entropy(ENT, TURN, torch.ones(2, 6))
    with pytest.raises(ValueError, match="token_entropy"):
        response_mean_entropy(torch.where(MASK.bool(), float("nan"), ENT), TURN, MASK)
    with pytest.raises(ValueError, match="turn_index"):
        response_mean_entropy(ENT, TURN.float(), MASK)


def test_aem_coefficients_rejects_bad_input():
    with pytest.raises(ValueError, match="response_entropy"):
        aem_coefficients(torch.tensor([0.1, float("nan")]), torch.tensor([0, 0]), lam=1.0)
    with pytest.raises(ValueError, match="group_index"):
        aem_coefficients(torch.tensor([0.1, 0.2]), torch.tensor([0]), lam=1.0)
    with pytest.raises(ValueError, match="lam"):
        aem_coefficients(torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), lam=float("nan"))


def test_aem_token_advantages_rejects_bad_input():
    res = response_mean_entropy(ENT, TURN, MASK)
    alpha = torch.ones(4)
    with pytest.raises(ValueError, match="alpha"):
        aem_token_advantages(torch.ones(2), torch.ones(3), res, TURN, MASK)
    with pytest.raises(ValueError, match="episode_adv"):
        aem_token_advantages(torch.ones(3), alpha, res, TURN, MASK)
    with pytest.raises(ValueError, match="episode_adv"):
        aem_token_advantages(torch.tensor([1.0, float("nan")]), alpha, res, TURN, MASK)
    # a masked token whose (episode, turn) is not among the responses
    other_turns = TURN.clone()
    other_turns[1, 0] = 2
    with pytest.raises(ValueError, match="responses"):
        aem_token_advantages(torch.ones(2), alpha, res, other_turns, MASK)
    with pytest.raises(ValueError, match="episode_group"):
        aem_advantages(torch.ones(2), torch.zeros(3, dtype=torch.long), ENT, TURN, MASK, lam=1.0)
    with pytest.raises(ValueError, match="token_entropy"):
        aem_advantages(torch.ones(3), torch.zeros(3, dtype=torch.long), ENT, TURN, MASK, lam=1.0)


# --- the sync-free code paths agree with the plain ones ----------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_aem_advantages_equals_its_three_steps(seed):
    # aem_advantages works on a dense (episode, turn) table; the steps on the (R,) responses
    dtype = [torch.float16, torch.bfloat16, torch.float32, torch.float64][seed % 4]
    ent, turn, mask, adv, episode_group = random_batch(seed, 2 + seed, 10 + 7 * seed, groups=3)
    if seed % 2:
        turn = torch.where(
            mask, torch.randint(0, 6, turn.shape, generator=torch.Generator().manual_seed(seed)), -1
        )
    ent, adv = ent.to(dtype), adv.to(dtype)
    res = response_mean_entropy(ent, turn, mask)
    alpha = aem_coefficients(res.entropy, episode_group[res.episode], lam=2.0)
    tok_adv = aem_token_advantages(adv, alpha, res, turn, mask)
    got_tok_adv, got_alpha = aem_advantages(adv, episode_group, ent, turn, mask, lam=2.0)
    assert torch.equal(got_alpha, alpha)
    assert torch.equal(got_tok_adv, tok_adv)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aem_token_advantages_accepts_responses_in_any_order(seed):
    ent, turn, mask, adv, _ = random_batch(seed, 5, 30, groups=2)
    res = response_mean_entropy(ent, turn, mask)
    alpha = torch.rand(
        res.entropy.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    expected = torch.zeros(5, 30, dtype=torch.float64)
    alpha_of = {
        (b, t): a for b, t, a in zip(res.episode.tolist(), res.turn.tolist(), alpha.tolist(), strict=True)
    }
    for b in range(5):
        for t in range(30):
            if mask[b, t]:
                expected[b, t] = alpha_of[(b, turn[b, t].item())] * adv[b].item()
    perm = torch.randperm(alpha.numel(), generator=torch.Generator().manual_seed(seed + 100))
    shuffled = ResponseEntropy(res.entropy[perm], res.episode[perm], res.turn[perm])
    torch.testing.assert_close(aem_token_advantages(adv, alpha[perm], shuffled, turn, mask), expected)


def test_aem_advantages_reports_derived_errors_like_its_steps():
    # λ < 0 large enough overflows exp(−λ·H̃) in fp32: α is NaN, as aem_token_advantages reports
    with pytest.raises(ValueError, match="alpha must be finite"):
        aem_advantages(torch.tensor([2.0, -1.0]), torch.tensor([4, 4]), ENT, TURN, MASK, lam=-200.0)
    # fp16 sums of a long response overflow: the response entropy is inf, as aem_coefficients reports
    ent = torch.full((1, 8), 60000.0, dtype=torch.float16)
    turn, mask = torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8)
    with pytest.raises(ValueError, match="response_entropy must be finite"):
        aem_advantages(
            torch.ones(1, dtype=torch.float16), torch.zeros(1, dtype=torch.long), ent, turn, mask, lam=1.0
        )
    # the earlier check wins when several fail
    with pytest.raises(ValueError, match="turn_index"):
        aem_advantages(
            torch.tensor([float("nan"), 1.0]), torch.tensor([4, 4]), ENT, TURN, torch.ones(2, 6), lam=1.0
        )
    with pytest.raises(ValueError, match="lam"):
        aem_advantages(
            torch.tensor([float("nan"), 1.0]), torch.tensor([4, 4]), ENT, TURN, MASK, lam=float("inf")
        )


def test_aem_advantages_syncs_twice():
    # one read of the argument checks and the table width, one nonzero listing the responses
    from torch.profiler import profile

    ent, turn, mask, adv, episode_group = random_batch(0, 4, 64, groups=2)
    reads = []
    original = torch.Tensor.tolist
    torch.Tensor.tolist = lambda self: reads.append(1) or original(self)
    try:
        with profile() as prof:
            aem_advantages(adv, episode_group, ent, turn, mask, lam=1.0)
    finally:
        torch.Tensor.tolist = original
    names = [e.name for e in prof.events()]
    assert len(reads) == 1
    assert names.count("aten::nonzero") == 1
    assert not {"aten::_local_scalar_dense", "aten::_unique2", "aten::unique_dim", "aten::bincount"} & set(
        names
    )
