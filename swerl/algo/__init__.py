"""Pure tensor math of the training step: advantages, DAPO shaping, AEM, ActFocus, losses, token stats,
importance weights for the rollout/learner mismatch, and the ActFocus energy–reward diagnostic.

No I/O and no config objects: every function takes tensors and plain numbers, and raises ValueError
(naming the argument) on bad input.
"""

from swerl.algo.actfocus import actfocus_weights
from swerl.algo.advantages import ESTIMATORS, dapo_keep_mask, group_advantages, overlong_penalty
from swerl.algo.aem import (
    ResponseEntropy,
    aem_advantages,
    aem_coefficients,
    aem_token_advantages,
    response_mean_entropy,
)
from swerl.algo.diagnostics import energy_reward_correlation, group_energy_reward_stats
from swerl.algo.losses import AGG_MODES, KL_KINDS, aggregate_loss, kl_penalty, policy_loss
from swerl.algo.offpolicy import IS_LEVELS, IS_MODES, ISMetrics, ISWeights, importance_weights, is_metrics
from swerl.algo.token_stats import TokenStats, token_statistics
from swerl.structs import Span

__all__ = [
    "AGG_MODES",
    "ESTIMATORS",
    "IS_LEVELS",
    "IS_MODES",
    "KL_KINDS",
    "ISMetrics",
    "ISWeights",
    "ResponseEntropy",
    "Span",
    "TokenStats",
    "actfocus_weights",
    "aem_advantages",
    "aem_coefficients",
    "aem_token_advantages",
    "aggregate_loss",
    "dapo_keep_mask",
    "energy_reward_correlation",
    "group_advantages",
    "group_energy_reward_stats",
    "importance_weights",
    "is_metrics",
    "kl_penalty",
    "overlong_penalty",
    "policy_loss",
    "response_mean_entropy",
    "token_statistics",
]
