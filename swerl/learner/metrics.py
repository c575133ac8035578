"""What one learner update reports (`UpdateMetrics`): a metrics.jsonl row (docs/metrics.md names each
field as logged).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateMetrics:
    """What one learner update did (ppo_epochs × mini_batches optimizer steps over a batch of episodes);
    a metrics.jsonl row; losses, clip fractions and grad norm are means over its optimizer steps.
    Token averages are over the model-generated tokens (loss mask 1) of the episodes kept."""

    step: int
    """Optimizer steps taken after this update (the learner's step counter)."""
    skipped: bool
    """No optimizer step was taken (every episode was filtered out, e.g. by DAPO's filter)."""
    episodes: int
    """Episodes in the batch handed to the learner."""
    episodes_kept: int
    """Episodes left after the DAPO filter (all of them when it is off)."""
    tokens: int
    """Model-generated tokens of the kept episodes (the tokens in the loss)."""
    micro_batches: int
    """Micro-batches run (forward + backward) over all optimizer steps of the update."""
    optimizer_steps: int
    """Optimizer steps taken in this update (ppo_epochs × mini_batches; 0 when skipped)."""
    reward_mean: float
    """Mean episode reward of the batch (before overlong shaping, all episodes)."""
    reward_shaped_mean: float
    """Mean reward after overlong shaping (equal to reward_mean when it is off)."""
    advantage_mean: float
    """Mean episode advantage over the kept episodes."""
    advantage_abs_mean: float
    """Mean |advantage| over the kept episodes."""
    loss: float
    """Total loss: policy loss + kl_coef · KL."""
    pg_loss: float
    """The clipped policy-gradient loss."""
    kl: float
    """Token-mean KL(π‖π_ref) estimate (the configured kind); NaN when KL is off."""
    clipfrac_low: float
    """Fraction of tokens with A < 0 clipped at 1 − clip_low."""
    clipfrac_high: float
    """Fraction of tokens with A > 0 clipped at 1 + clip_high."""
    clipfrac_dual: float
    """Fraction of tokens where the dual clip applied."""
    approx_kl: float
    """½·(logp − old_logp)² averaged over tokens: how far the policy is from the rollout policy."""
    grad_norm: float
    """Gradient norm before clipping."""
    entropy: float
    """Mean policy entropy per token (nats)."""
    aem_alpha_mean: float
    """Mean AEM α over responses (1 when AEM is off or all α are 1)."""
    aem_alpha_min: float
    """Smallest AEM α."""
    aem_alpha_max: float
    """Largest AEM α."""
    actfocus_weight_action: float
    """Mean ActFocus weight of action tokens (1 when ActFocus is off)."""
    actfocus_weight_reasoning: float
    """Mean ActFocus weight of reasoning tokens (1 when ActFocus is off)."""
    action_token_share: float
    """Action tokens / generated tokens."""
    energy_action: float
    """Mean reference-model energy of action tokens; NaN when no reference pass ran."""
    energy_reasoning: float
    """Mean reference-model energy of reasoning tokens; NaN when no reference pass ran."""
    lr: float
    """Learning rate of the step."""
    update_s: float
    """Seconds the update took (pre-passes, forward, backward, optimizer step)."""
    tokens_per_s: float
    """Sequence tokens (padding excluded) processed per second of update_s."""
    actfocus_weight_min: float = 1.0
    """Smallest ActFocus weight over reasoning and action tokens (1 when ActFocus is off)."""
    actfocus_weight_max: float = 1.0
    """Largest ActFocus weight over reasoning and action tokens (1 when ActFocus is off)."""
    energy_reward_corr_pearson: float = float("nan")
    """ActFocus diagnostic: Pearson correlation across the kept rollout groups between a group's mean
    reference energy of action tokens and the variance of its rewards; NaN when no reference pass ran,
    fewer than 3 groups have action tokens, or either side has zero variance."""
    energy_reward_corr_spearman: float = float("nan")
    """Spearman (rank) version of energy_reward_corr_pearson; NaN under the same conditions."""
    energy_reward_corr_groups: int = 0
    """Rollout groups with action tokens that entered the correlation (0 without a reference pass)."""
    energy_reward_corr_reasoning_pearson: float = float("nan")
    """The same correlation for reasoning tokens' mean reference energy (ActFocus: about 0)."""
    energy_reward_corr_reasoning_spearman: float = float("nan")
    """Spearman version of energy_reward_corr_reasoning_pearson."""
    group_energy_action: tuple[float, ...] = ()
    """Per kept rollout group: mean reference energy of its action tokens (NaN: none); () without a
    reference pass. Kept so that correlations can be pooled over steps and runs."""
    group_energy_reasoning: tuple[float, ...] = ()
    """Per kept rollout group: mean reference energy of its reasoning tokens."""
    group_reward_var: tuple[float, ...] = ()
    """Per kept rollout group: population variance of its rewards."""
    is_ratio_mean: float = float("nan")
    """Mean ratio π_old/μ of the learner's over the engine's probability of the sampled tokens (per
    sequence at rollout_is.level sequence / geometric); NaN unless the learner recomputes old log-probs."""
    is_ratio_max: float = float("nan")
    """Largest such ratio."""
    is_capped_fraction: float = float("nan")
    """Share of ratios beyond rollout_is.cap (or under its lower bound in mask mode): capped or dropped
    when rollout_is is on, and how many would be when it is off."""
    mismatch_kl_k1: float = float("nan")
    """KL(engine ‖ learner) per token on the engine's samples, k1 = mean(log μ − log π_old)."""
    mismatch_kl_k3: float = float("nan")
    """The same with the k3 estimator, mean(r − 1 − log r) ≥ 0."""
