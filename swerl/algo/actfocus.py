"""ActFocus: per-token loss weights that move gradient from reasoning to actions (arXiv 2605.14558).

    w_t = α                                    reasoning token (span 1)
    w_t = 1 + β · sigmoid((E_t − μ_E) / σ_E)   action token (span 2)
    w_t = 0                                    anything else (span 0: prompt, observation; mask 0)

E_t = −logsumexp of the frozen reference model's logits at t (TokenStats.energy of the reference
pass). μ_E and σ_E are the mean and the *population* std (divide by n) of the energies of the
action tokens of the batch under mask: the batch is the whole population being normalised, and the
population std is defined for a single token. With fewer than two action tokens the normalised
energy is 0, so each action token weighs 1 + β/2.
"""

import torch
from torch import Tensor

from swerl.algo._checks import bool_mask, check_finite, check_number, check_tensor

SPAN_OTHER, SPAN_REASONING, SPAN_ACTION = 0, 1, 2


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
        span: (B, T) integer, 0 other, 1 reasoning, 2 action (the Trajectory contract).
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
    if bool(((span < SPAN_OTHER) | (span > SPAN_ACTION)).any()):
        raise ValueError("span must hold 0 (other), 1 (reasoning) or 2 (action)")
    action = valid & (span == SPAN_ACTION)  # (B, T)
    reasoning = valid & (span == SPAN_REASONING)
    check_finite(energy, "energy", where=action)
    # fp64 statistics: with equal energies an fp32 mean is off by ~1 ulp, and that noise divided
    # by σ + eps (σ ~ 1 ulp too) would turn into a z-score of order 1
    e = energy.detach().double()

    n = action.sum()
    e_action = torch.where(action, e, 0.0)
    mu = e_action.sum() / n.clamp(min=1)
    sigma = (torch.where(action, e - mu, 0.0).square().sum() / n.clamp(min=1)).sqrt()
    z = torch.where(n >= 2, (e_action - mu) / (sigma + eps), 0.0)  # (B, T)
    w_action = (1.0 + beta * torch.sigmoid(z)).to(energy.dtype)
    w_reasoning = torch.full_like(w_action, alpha)
    return torch.where(action, w_action, torch.where(reasoning, w_reasoning, 0.0))
