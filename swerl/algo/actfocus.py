"""ActFocus: per-token loss weights that move gradient from reasoning to actions (arXiv 2605.14558;
see docs/actfocus.md).

    w_t = α                                    reasoning token (span 1)
    w_t = 1 + β · sigmoid((E_t − μ_E) / σ_E)   action token (span 2)
    w_t = 0                                    anything else (span 0: prompt, observation; mask 0)

E_t = −logsumexp of the frozen reference model's logits at t (TokenStats.energy of the reference
pass). μ_E and σ_E are the mean and the *population* std (divide by n) of the energies of the
action tokens of the batch under mask: the batch is the whole population being normalised, and the
population std is defined for a single token. With fewer than two action tokens the normalised
energy is 0, so each action token weighs 1 + β/2.

The data-dependent argument checks are read in one host sync, after the weights are queued.
"""

import torch
from torch import Tensor

from swerl.algo._checks import DeferredChecks, bool_mask, check_number, check_tensor
from swerl.structs import Span


def actfocus_weights(
    energy: Tensor,
    span: Tensor,
    mask: Tensor,
    alpha: float,
    beta: float,
    eps: float = 1e-6,
) -> Tensor:
    """ActFocus token weights, to pass as policy_loss(weights=...).

    Args:
        energy: (B, T) reference-model energy per token; only action tokens are read. No gradient.
        span: (B, T) integer `Span`: 0 context, 1 reasoning, 2 action (the Trajectory contract).
        mask: (B, T) 0/1 model-generated tokens; weight 0 where mask is 0.
        alpha: weight of reasoning tokens, >= 0 (paper: 0.1 Sokoban, 0.3 WebShop).
        beta: extra weight of uncertain action tokens, >= 0 (kept moderate in the paper).
        eps: added to σ_E.

    Returns:
        (B, T) weights, dtype of energy.
    """
    check_tensor(energy, "energy", ndim=2, kind="float")
    check_tensor(span, "span", kind="int")
    if span.shape != energy.shape:
        raise ValueError(
            f"span must have the same shape as energy {tuple(energy.shape)}, got {tuple(span.shape)}"
        )
    valid = bool_mask(mask, "mask", energy.shape)
    alpha = check_number(alpha, "alpha", min_value=0.0)
    beta = check_number(beta, "beta", min_value=0.0)
    eps = check_number(eps, "eps", min_value=0.0)
    checks = DeferredChecks()
    checks.add(
        (span.clamp(Span.CONTEXT, Span.ACTION) != span).any(),
        lambda: "span must hold 0 (other), 1 (reasoning) or 2 (action)",
    )
    action = valid & (span == Span.ACTION)  # (B, T)
    reasoning = valid & (span == Span.REASONING)
    # fp64 statistics: with equal energies an fp32 mean is off by ~1 ulp, and that noise divided
    # by σ + eps (σ ~ 1 ulp too) would turn into a z-score of order 1
    e = energy.detach().double()
    e_action = torch.where(action, e, 0.0)  # energies of the action tokens, 0 elsewhere
    checks.finite(e_action, "energy")  # NaN/inf in e_action are exactly those of energy under action

    n = action.sum()
    n1 = n.clamp(min=1)
    mu = e_action.sum() / n1
    centred = e_action - mu  # (B, T) E − μ_E at action tokens
    sigma = (torch.where(action, centred, 0.0).square().sum() / n1).sqrt()
    # with fewer than two action tokens divide by inf: z = ±0, and sigmoid(±0) = 1/2 exactly
    z = centred / torch.where(n >= 2, sigma + eps, float("inf"))  # (B, T)
    w_action = (1.0 + beta * torch.sigmoid(z)).to(energy.dtype)
    w_reasoning = torch.full_like(w_action, alpha)
    weights = torch.where(action, w_action, torch.where(reasoning, w_reasoning, 0.0))
    checks.check()  # the only host sync, after all the work is queued
    return weights
