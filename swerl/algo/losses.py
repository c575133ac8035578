"""Clipped policy-gradient loss, loss aggregation and KL estimators (per token, (B, T)).

References:
    PPO clip: Schulman et al. 2017 (arXiv 1707.06347), eq. 7.
    Clip-higher (separate low/high ranges, DAPO uses 0.2/0.28): Yu et al. 2025 (arXiv 2503.14476), §3.1.
    Dual clip for A < 0: Ye et al. 2020 (arXiv 1912.09729); as in verl's compute_policy_loss.
    Dr.GRPO constant-horizon aggregation: Liu et al. 2025 (arXiv 2503.20783).
    KL estimators k1/k2/k3: J. Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx.html).
"""

import torch
from torch import Tensor

from swerl.algo._checks import bool_mask, check_choice, check_finite, check_number, check_tensor

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")

# exp() of a log-ratio beyond this overflows nothing but is meaningless; verl clamps the same way
_MAX_LOG_RATIO = 20.0


def aggregate_loss(per_token: Tensor, mask: Tensor, agg: str = "token-mean") -> Tensor:
    """Reduces a (B, T) per-token loss to a scalar over the tokens where mask is nonzero.

    Modes:
        token-mean: Σ over masked tokens / number of masked tokens (DAPO's token-level loss).
        seq-mean-token-sum: Σ per sequence, then mean over sequences.
        seq-mean-token-mean: mean per sequence, then mean over sequences (the original GRPO).
        seq-mean-token-sum-norm: Σ per sequence / T (a constant horizon, the batch's T, as
            Dr.GRPO), then mean over sequences.
    "Mean over sequences" counts the sequences with at least one masked token: all-padding rows
    do not dilute the loss. With no masked token at all the loss is 0 (and still differentiable).
    Masked-out positions are selected away, so NaN/inf there cannot leak into the loss.
    """
    check_tensor(per_token, "per_token", ndim=2, kind="float")
    valid = bool_mask(mask, "mask", per_token.shape)
    check_choice(agg, "agg", AGG_MODES)
    masked = torch.where(valid, per_token, 0.0)  # (B, T)
    if agg == "token-mean":
        return masked.sum() / valid.sum().clamp(min=1)
    seq_sum = masked.sum(dim=-1)  # (B,)
    seq_len = valid.sum(dim=-1)  # (B,)
    if agg == "seq-mean-token-sum":
        per_seq = seq_sum
    elif agg == "seq-mean-token-mean":
        per_seq = seq_sum / seq_len.clamp(min=1)
    else:
        per_seq = seq_sum / per_token.shape[-1]
    nonempty = seq_len > 0
    return torch.where(nonempty, per_seq, 0.0).sum() / nonempty.sum().clamp(min=1)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    weights: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO/GRPO clipped surrogate with clip-higher, dual clip and per-token weights.

    Per token, with r = exp(logp − old_logp) (log-ratio clamped to ±20 as in verl):
        l = max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high))
        l = min(l, −dual_clip·A)   where A < 0 (dual clip; dual_clip=None disables it)
        l = w · l                  (weights, e.g. ActFocus; they do not change the denominators)
    then aggregate_loss(l, mask, agg).

    Args:
        logp: (B, T) log-probs of the taken tokens under the current policy (carries the gradient).
        old_logp: (B, T) log-probs under the policy that generated the rollouts (a constant).
        advantages: (B,) per sequence, broadcast over tokens, or (B, T) per token (e.g. AEM). A constant.
        mask: (B, T) 0/1 tokens that take part in the loss.
        weights: optional (B, T) per-token multipliers of the loss.
        clip_low, clip_high: the clip range is [1 − clip_low, 1 + clip_high] (DAPO: 0.2, 0.28).
        dual_clip: the constant c > 1 of dual clip, or None.
        agg: one of AGG_MODES.

    Returns:
        (loss, metrics). metrics holds detached 0-d tensors over the masked tokens:
        clipfrac_low (A < 0, r < 1 − clip_low), clipfrac_high (A > 0, r > 1 + clip_high),
        clipfrac_dual (A < 0 and the dual-clip cap is what applies), approx_kl (k2: mean of
        ½(logp − old_logp)²), approx_kl_k1 (mean of old_logp − logp, verl's ppo_kl), ratio_mean,
        ratio_min, ratio_max (NaN when no token is masked), num_tokens.
    """
    check_tensor(logp, "logp", ndim=2, kind="float")
    check_tensor(old_logp, "old_logp", kind="float")
    if old_logp.shape != logp.shape:
        raise ValueError(
            f"old_logp must have the same shape as logp {tuple(logp.shape)}, got {tuple(old_logp.shape)}"
        )
    valid = bool_mask(mask, "mask", logp.shape)  # (B, T)
    check_tensor(advantages, "advantages", kind="float")
    if advantages.shape == logp.shape[:1]:
        adv = advantages.detach()[:, None].expand_as(logp)  # (B, T)
        check_finite(advantages, "advantages")
    elif advantages.shape == logp.shape:
        adv = advantages.detach()
        check_finite(adv, "advantages", where=valid)
    else:
        raise ValueError(
            f"advantages must have shape (B,)={tuple(logp.shape[:1])} or (B, T)={tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if weights is not None:
        check_tensor(weights, "weights", kind="float")
        if weights.shape != logp.shape:
            raise ValueError(
                f"weights must have the same shape as logp {tuple(logp.shape)}, got {tuple(weights.shape)}"
            )
        check_finite(weights, "weights", where=valid)
    clip_low = check_number(clip_low, "clip_low", min_value=0.0, max_value=1.0)
    if clip_low == 1.0:
        raise ValueError("clip_low must be < 1 (the lower bound 1 − clip_low must stay positive)")
    clip_high = check_number(clip_high, "clip_high", min_value=0.0)
    if dual_clip is not None:
        dual_clip = check_number(dual_clip, "dual_clip", min_value=1.0, min_inclusive=False)
    check_choice(agg, "agg", AGG_MODES)

    log_ratio = logp - old_logp.detach()  # (B, T)
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    clip_active = loss_clipped > loss_unclipped
    negative = adv < 0
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_active = negative & (per_token > cap)
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)
    else:
        dual_active = torch.zeros_like(valid)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate_loss(per_token, valid, agg)

    with torch.no_grad():
        n = valid.sum()
        denom = n.clamp(min=1).to(logp.dtype)

        def frac(x: Tensor) -> Tensor:
            return (x & valid).sum().to(logp.dtype) / denom

        lr = log_ratio.detach()
        r = ratio.detach()
        nan = torch.tensor(float("nan"), dtype=logp.dtype, device=logp.device)
        metrics = {
            "clipfrac_low": frac(clip_active & negative),
            "clipfrac_high": frac(clip_active & (adv > 0)),
            "clipfrac_dual": frac(dual_active),
            "approx_kl": torch.where(valid, 0.5 * lr.square(), 0.0).sum() / denom,
            "approx_kl_k1": torch.where(valid, -lr, 0.0).sum() / denom,
            "ratio_mean": torch.where(n > 0, torch.where(valid, r, 0.0).sum() / denom, nan),
            "ratio_min": torch.where(n > 0, torch.where(valid, r, float("inf")).amin(), nan),
            "ratio_max": torch.where(n > 0, torch.where(valid, r, float("-inf")).amax(), nan),
            "num_tokens": n.to(logp.dtype),
        }
    return loss, metrics


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(π‖π_ref) from samples of π (Schulman's k1/k2/k3).

    With d = logp − ref_logp: k1 = d (unbiased, high variance); k2 = ½·d² (low variance, biased);
    k3 = exp(−d) + d − 1 = exp(ref − logp) − (ref − logp) − 1 (unbiased, >= 0, low variance; verl's
    "low_var_kl", here without verl's clamp to [−10, 10]). Gradient flows through both arguments;
    detach ref_logp when it comes from a frozen model. Aggregate with aggregate_loss.
    """
    check_tensor(logp, "logp", kind="float")
    check_tensor(ref_logp, "ref_logp", kind="float")
    if ref_logp.shape != logp.shape:
        raise ValueError(
            f"ref_logp must have the same shape as logp {tuple(logp.shape)}, got {tuple(ref_logp.shape)}"
        )
    check_choice(kind, "kind", KL_KINDS)
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    return torch.exp(-d) + d - 1.0
