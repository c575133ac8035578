import math

import pytest
import torch

from swerl.algo import AGG_MODES, aggregate_loss, kl_penalty, policy_loss


def naive_policy_loss(logp, old, adv, mask, weights, clip_low, clip_high, dual_clip, agg):
    """Per-token loops on 0-d tensors (so autograd gives the reference gradient too)."""
    batch, length = logp.shape
    per_seq, n_total, total = [], 0, 0.0
    for b in range(batch):
        seq_total, n = 0.0, 0
        for t in range(length):
            if not mask[b][t]:
                continue
            a = float(adv[b]) if adv.ndim == 1 else float(adv[b, t])
            ratio = torch.exp(logp[b, t] - old[b, t])
            loss = max(-a * ratio, -a * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
            if dual_clip is not None and a < 0:
                loss = min(loss, torch.tensor(-a * dual_clip, dtype=logp.dtype))
            if weights is not None:
                loss = loss * weights[b, t]
            seq_total, n = seq_total + loss, n + 1
        total, n_total = total + seq_total, n_total + n
        if n:
            per_seq.append(
                {"seq-mean-token-sum": seq_total, "seq-mean-token-mean": seq_total / n}.get(
                    agg, seq_total / length
                )
            )
    if agg == "token-mean":
        return total / max(n_total, 1)
    return sum(per_seq) / max(len(per_seq), 1)


def hand_case():
    # A = [1, −1, −1, 1], ratios [1.5, 0.5, 5, 1.1] with clip [0.8, 1.2] and dual clip 3
    ratios = torch.tensor([[1.5, 0.5, 5.0, 1.1]])
    old = torch.tensor([[-1.0, -2.0, -3.0, -0.5]])
    logp = (old + ratios.log()).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    return logp, old, adv, torch.ones(1, 4)


# --- hand-computed cases -------------------------------------------------------------------------


def test_policy_loss_by_hand():
    logp, old, adv, mask = hand_case()
    loss, m = policy_loss(logp, old, adv, mask)
    # t0: max(−1.5, −1.2) = −1.2 (high clip); t1: max(0.5, 0.8) = 0.8 (low clip);
    # t2: max(5, 1.2) = 5, capped at −3·A = 3 (dual clip); t3: −1.1 (inside the range)
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 1.1) / 4, abs=1e-6)
    assert m["clipfrac_high"].item() == pytest.approx(0.25)
    assert m["clipfrac_low"].item() == pytest.approx(0.25)
    assert m["clipfrac_dual"].item() == pytest.approx(0.25)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 5 + 1.1) / 4, abs=1e-6)
    assert m["ratio_min"].item() == pytest.approx(0.5, abs=1e-6)
    assert m["ratio_max"].item() == pytest.approx(5.0, abs=1e-5)
    logs = [math.log(x) for x in (1.5, 0.5, 5.0, 1.1)]
    assert m["approx_kl"].item() == pytest.approx(sum(0.5 * x * x for x in logs) / 4, abs=1e-6)
    assert m["approx_kl_k1"].item() == pytest.approx(-sum(logs) / 4, abs=1e-6)
    assert m["num_tokens"].item() == 4
    # clipped and capped tokens get no gradient; t3: d(−A·r)/d logp = −r = −1.1, over 4 tokens
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0, -1.1 / 4]]))


def test_dual_clip_off_and_clip_higher():
    logp, old, adv, mask = hand_case()
    loss, m = policy_loss(logp, old, adv, mask, dual_clip=None)
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 5.0 - 1.1) / 4, abs=1e-6)
    assert m["clipfrac_dual"].item() == 0.0
    # DAPO clip-higher 0.28: ratio 1.25 with A = 1 is inside [0.8, 1.28], so −1.25 and no clipping
    one = torch.tensor([[math.log(1.25)]])
    loss, m = policy_loss(one, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25, abs=1e-6)
    assert m["clipfrac_high"].item() == 0.0
    loss, m = policy_loss(one, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert m["clipfrac_high"].item() == 1.0


# per-token loss L with mask M (T = 4): rows [1, 2 | 3, 4], [5, 6, 7 | 8], and an all-masked row
L = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
M = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
AGG_BY_HAND = {
    "token-mean": (1 + 2 + 5 + 6 + 7) / 5,  # 4.2
    "seq-mean-token-sum": (3 + 18) / 2,  # the all-masked row is not a sequence: 10.5
    "seq-mean-token-mean": (3 / 2 + 18 / 3) / 2,  # 3.75
    "seq-mean-token-sum-norm": (3 / 4 + 18 / 4) / 2,  # T = 4 is the horizon: 2.625
}


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregation_by_hand(agg):
    assert aggregate_loss(L, M, agg).item() == pytest.approx(AGG_BY_HAND[agg])
    # the same through policy_loss: ratio 1 and A = −L make every per-token loss equal to L
    logp = torch.zeros(3, 4)
    loss, _ = policy_loss(logp, logp, -L, M, agg=agg)
    assert loss.item() == pytest.approx(AGG_BY_HAND[agg])
    # weights multiply the per-token loss, denominators stay token/sequence counts
    loss, _ = policy_loss(logp, logp, -L, M, agg=agg, weights=torch.full((3, 4), 0.5))
    assert loss.item() == pytest.approx(AGG_BY_HAND[agg] / 2)


def test_sequence_advantages_broadcast_over_tokens():
    gen = torch.Generator().manual_seed(0)
    logp, old = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    adv = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.rand(3, 5, generator=gen) < 0.7
    a, ma = policy_loss(logp, old, adv, mask)
    b, mb = policy_loss(logp, old, adv[:, None].expand(3, 5), mask)
    assert a.item() == b.item()
    assert ma.keys() == mb.keys() and all(ma[k].item() == mb[k].item() for k in ma)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_empty_mask_gives_zero_loss_and_gradient(agg):
    logp = torch.randn(2, 3, requires_grad=True)
    loss, m = policy_loss(logp, torch.randn(2, 3), torch.ones(2), torch.zeros(2, 3), agg=agg)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logp.grad, torch.zeros(2, 3))
    assert m["num_tokens"].item() == 0 and m["clipfrac_low"].item() == 0.0
    assert math.isnan(m["ratio_mean"].item()) and math.isnan(m["ratio_max"].item())


def test_garbage_under_mask_does_not_leak():
    logp = torch.tensor([[-1.0, float("nan")], [-0.5, float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0], [-1.0, float("nan")]])
    adv = torch.tensor([[1.0, float("nan")], [-1.0, 1.0]])
    mask = torch.tensor([[1, 0], [1, 0]])
    loss, m = policy_loss(logp, old, adv, mask)
    loss.backward()
    # t(0,0): −1·1 = −1;  t(1,0): ratio e^0.5 = 1.6487, A = −1 → max(1.6487, 1.2) = 1.6487
    assert loss.item() == pytest.approx((-1.0 + math.exp(0.5)) / 2, abs=1e-6)
    assert torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v.item()) for v in m.values())


# --- equivalence with naive loops -----------------------------------------------------------------


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(
    ("seed", "shape", "per_token", "weighted", "dual"),
    [
        (0, (1, 6), False, False, 3.0),
        (1, (4, 9), True, True, None),
        (2, (3, 5), True, False, 2.0),
        (3, (5, 3), False, True, 3.0),
    ],
)
def test_policy_loss_matches_naive(agg, seed, shape, per_token, weighted, dual):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    logp = (old + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5).requires_grad_()
    adv = torch.randn(shape if per_token else shape[:1], generator=gen, dtype=torch.float64)
    mask = torch.rand(shape, generator=gen) < 0.75
    mask[0] = False  # an all-padding row
    weights = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 if weighted else None
    kw = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": dual}
    loss, _ = policy_loss(logp, old, adv, mask, weights=weights, agg=agg, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    ref = naive_policy_loss(logp, old, adv, mask.tolist(), weights, agg=agg, **kw)
    ref = torch.as_tensor(ref, dtype=torch.float64)
    ref_grad = torch.autograd.grad(ref, logp)[0] if ref.requires_grad else torch.zeros_like(logp)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)


# --- KL ----------------------------------------------------------------------------------------


def test_kl_penalty_by_hand():
    logp, ref = torch.tensor([math.log(2.0), 0.0]), torch.tensor([0.0, 0.0])
    d = math.log(2.0)  # logp − ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([d, 0.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.5 * d * d, 0.0]))
    # k3 = exp(ref − logp) − (ref − logp) − 1 = 0.5 + ln 2 − 1 = 0.1931
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([0.5 + d - 1.0, 0.0]))


def test_kl_penalty_matches_naive_and_k3_is_nonnegative():
    gen = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    k3 = kl_penalty(logp, ref, "k3")
    for (b, t), v in zip(
        torch.cartesian_prod(torch.arange(4), torch.arange(6)).tolist(), k3.flatten(), strict=True
    ):
        x = ref[b, t].item() - logp[b, t].item()
        # fp32 elementwise (no reduction): a subtraction, exp (≤ 1 ulp) and two more roundings of values
        # ≤ eˣ + |x| + 1: ≤ 5·2⁻²⁴·(eˣ + |x| + 1), under rel=1e-5 for large x and abs=1e-6 for small
        assert v.item() == pytest.approx(math.exp(x) - x - 1, rel=1e-5, abs=1e-6)
    assert (k3 >= 0).all()
    logp.requires_grad_()
    (g,) = torch.autograd.grad(kl_penalty(logp, ref, "k2").sum(), logp)
    torch.testing.assert_close(g, logp.detach() - ref)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"old_logp": torch.zeros(2, 4)}, "old_logp"),
        ({"mask": torch.ones(2, 4)}, "mask"),
        ({"advantages": torch.zeros(3)}, "advantages"),
        ({"advantages": torch.tensor([0.0, float("nan")])}, "advantages"),
        ({"advantages": torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])}, "advantages"),
        ({"weights": torch.ones(2, 2)}, "weights"),
        ({"agg": "mean"}, "agg"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_low": -0.1}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"logp": torch.zeros(2, 3, dtype=torch.long)}, "logp"),
    ],
)
def test_policy_loss_rejects_bad_input(kwargs, match):
    args = {
        "logp": torch.zeros(2, 3),
        "old_logp": torch.zeros(2, 3),
        "advantages": torch.zeros(2),
        "mask": torch.ones(2, 3),
    } | kwargs
    with pytest.raises(ValueError, match=match):
        policy_loss(**args)


def test_kl_and_aggregate_reject_bad_input():
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_penalty(torch.zeros(2), torch.zeros(3), "k1")
    with pytest.raises(ValueError, match="agg"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 3))
