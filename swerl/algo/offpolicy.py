"""Rollout-engine / learner mismatch correction: importance weights between the engine's sampling
log-probs (the behaviour policy μ that produced the tokens) and the learner's log-probs of the same
tokens (π_old, the policy the update is computed for), per token, (B, T).

The two differ even at the same weights (other kernels, bf16 vs fp32, fused sampling) and more once
rollouts are stale (async training). Weights r = π_old(a) / μ(a):
    level  token:      r_t = exp(logπ_t − logμ_t)
           sequence:   r = exp(Σ_t (logπ_t − logμ_t)) over the sequence's tokens, the same for each
           geometric:  r = exp(mean_t (logπ_t − logμ_t)), a length-free sequence ratio
    mode   truncate:   w = min(r, cap)                      (truncated IS, TIS)
           mask:       w = r where lower ≤ r ≤ cap, else 0  (masked IS, MIS: a token — or the whole
                                                             sequence — far off-policy is dropped)
The weights are constants of the loss (detached): they rescale each token's policy-gradient term.

References:
    Truncated IS for the rollout/training mismatch: F. Yao et al. 2025, "Your Efficient RL Framework
        Secretly Brings You Off-Policy RL Training" (fengyao.notion.site/off-policy-rl), §2.
    Token / sequence / geometric levels and masking (MIS): J. Liu et al. 2025, "When Speed Kills
        Stability: Demystifying RL Collapse from the Training-Inference Mismatch"; verl's rollout_is.
    Truncated importance weights: Espeholt et al. 2018 (IMPALA, arXiv 1802.01561), V-trace's ρ̄.
    KL estimators k1 / k3: J. Schulman, "Approximating KL Divergence" (2020).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from swerl.algo._checks import (
    bool_mask,
    check_choice,
    check_finite,
    check_number,
    check_same_shape,
    check_tensor,
)

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask")

# exp(±20): a ratio beyond is meaningless, and the sum over a sequence must not overflow
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class ISWeights:
    """Importance weights of one batch (see the module docstring)."""

    weights: Tensor
    """(B, T) the factor on each token's policy-gradient term; 0 outside the mask and where masked out."""
    ratio: Tensor
    """(B, T) r before capping (the sequence's r on each of its tokens); 1 outside the mask."""
    kept: Tensor
    """(B, T) bool: tokens of the mask that the correction kept (all of them with `truncate`)."""
    capped: Tensor
    """(B, T) bool: tokens of the mask whose r was out of range (capped, or dropped with `mask`)."""


@dataclass(frozen=True)
class ISMetrics:
    """Per-batch numbers for the logs, over the mask's tokens (sequence levels: over sequences)."""

    ratio_mean: float
    ratio_max: float
    capped_fraction: float
    """Share of tokens (sequences) whose ratio was out of range: capped, or dropped."""
    mismatch_k1: float
    """KL(μ ‖ π_old) estimated on μ's samples: mean(logμ − logπ)."""
    mismatch_k3: float
    """The same with Schulman's k3: mean(r − 1 − log r), ≥ 0 and lower-variance."""


def importance_weights(learner_logp: Tensor, engine_logp: Tensor, mask: Tensor, *, level: str = "token",
                       mode: str = "truncate", cap: float = 2.0, lower: float | None = None) -> ISWeights:
    """Importance weights r = π_old / μ, truncated at `cap` or masked outside [lower, cap].

    learner_logp, engine_logp: (B, T) log-probs of the sampled tokens; mask: (B, T), nonzero on the
    tokens being trained on. lower: the mask mode's lower bound (default 1 / cap); unused by truncate.
    """
    check_tensor(learner_logp, "learner_logp", ndim=2, kind="float")
    check_tensor(engine_logp, "engine_logp", ndim=2, kind="float")
    check_same_shape(engine_logp, "engine_logp", learner_logp, "learner_logp")
    valid = bool_mask(mask, "mask", learner_logp.shape)
    check_choice(level, "level", IS_LEVELS)
    check_choice(mode, "mode", IS_MODES)
    cap = check_number(cap, "cap", min_value=1.0)
    lower = check_number(1.0 / cap if lower is None else lower, "lower", min_value=0.0, max_value=1.0)
    check_finite(learner_logp, "learner_logp", where=valid)
    check_finite(engine_logp, "engine_logp", where=valid)

    log_r = torch.where(valid, learner_logp.detach() - engine_logp.detach(), 0.0)  # (B, T)
    if level == "token":
        log_ratio = log_r.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    else:
        seq = log_r.sum(dim=-1)  # (B,)
        if level == "geometric":
            seq = seq / valid.sum(dim=-1).clamp(min=1)
        log_ratio = seq.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)[:, None].expand_as(log_r)  # (B, T)
    ratio = torch.where(valid, log_ratio.exp(), 1.0)  # (B, T)
    if mode == "truncate":
        capped = valid & (ratio > cap)
        kept = valid
        weights = torch.where(valid, ratio.clamp(max=cap), 0.0)
    else:
        capped = valid & ((ratio > cap) | (ratio < lower))
        kept = valid & ~capped
        weights = torch.where(kept, ratio, 0.0)
    return ISWeights(weights=weights, ratio=ratio, kept=kept, capped=capped)


def is_metrics(w: ISWeights, learner_logp: Tensor, engine_logp: Tensor, mask: Tensor, *,
               level: str = "token") -> ISMetrics:
    """The numbers of `w` for the logs. Ratios and the capped share count tokens at the token level
    and sequences at the sequence levels; the mismatch KL is always per token."""
    valid = bool_mask(mask, "mask", learner_logp.shape)
    check_choice(level, "level", IS_LEVELS)
    n = int(valid.sum())
    if n == 0:
        nan = float("nan")
        return ISMetrics(nan, nan, nan, nan, nan)
    log_r = (learner_logp.detach() - engine_logp.detach()).double()[valid]  # (N,)
    r_tok = log_r.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    k1 = float(-log_r.mean())
    k3 = float((r_tok - 1 - log_r.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).mean())
    if level == "token":
        ratios, capped = w.ratio[valid].double(), w.capped[valid]
    else:
        rows = valid.any(dim=-1)  # (B,)
        first = valid.float().argmax(dim=-1)  # (B,) a token of each sequence carries its ratio
        idx = torch.arange(valid.shape[0], device=valid.device)[rows]  # on the mask's device (CUDA)
        ratios, capped = w.ratio[idx, first[rows]].double(), w.capped[idx, first[rows]]
    return ISMetrics(ratio_mean=float(ratios.mean()), ratio_max=float(ratios.max()),
                     capped_fraction=float(capped.double().mean()), mismatch_k1=k1, mismatch_k3=k3)
