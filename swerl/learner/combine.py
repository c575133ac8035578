"""The metrics of a data-parallel update: each rank's `UpdateMetrics` of its share of the batch,
combined into the whole batch's."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

from swerl.algo.diagnostics import GroupEnergies, merge_group_energies
from swerl.learner.metrics import UpdateMetrics

_NAN = float("nan")


def _wmean(values: list[float], weights: list[float]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if w > 0 and not math.isnan(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else _NAN


def combine_rank_metrics(ms: list[UpdateMetrics],
                         corr: list[GroupEnergies | None]) -> UpdateMetrics:
    """Global UpdateMetrics: counts summed; loss-type fields are per-rank shares of each step (summed);
    means weighted by what they average over; extremes min/max; the energy–reward correlation
    recomputed over all groups (`corr`: each rank's per-group action energies and reward variances,
    None without a reference pass)."""
    if len(ms) == 1 and corr[0] is None:
        return ms[0]
    m0 = ms[0]
    tok = [float(m.tokens) for m in ms]
    eps = [float(m.episodes) for m in ms]
    kept = [float(m.episodes_kept) for m in ms]
    act = [m.tokens * (m.action_token_share if not math.isnan(m.action_token_share) else 0.0) for m in ms]
    rea = [t - a for t, a in zip(tok, act, strict=True)]
    out: dict[str, Any] = {
        "episodes": sum(m.episodes for m in ms), "episodes_kept": sum(m.episodes_kept for m in ms),
        "tokens": sum(m.tokens for m in ms), "micro_batches": max(m.micro_batches for m in ms),
        "reward_mean": _wmean([m.reward_mean for m in ms], eps),
        "reward_shaped_mean": _wmean([m.reward_shaped_mean for m in ms], eps),
        "advantage_mean": _wmean([m.advantage_mean for m in ms], kept),
        "advantage_abs_mean": _wmean([m.advantage_abs_mean for m in ms], kept),
        "entropy": _wmean([m.entropy for m in ms], tok),
        "aem_alpha_mean": _wmean([m.aem_alpha_mean for m in ms], kept),
        "aem_alpha_min": min(m.aem_alpha_min for m in ms), "aem_alpha_max": max(m.aem_alpha_max for m in ms),
        "actfocus_weight_action": _wmean([m.actfocus_weight_action for m in ms], act),
        "actfocus_weight_reasoning": _wmean([m.actfocus_weight_reasoning for m in ms], rea),
        "actfocus_weight_min": min(m.actfocus_weight_min for m in ms),
        "actfocus_weight_max": max(m.actfocus_weight_max for m in ms),
        "action_token_share": sum(act) / sum(tok) if sum(tok) else _NAN,
        "energy_action": _wmean([m.energy_action for m in ms], act),
        "energy_reasoning": _wmean([m.energy_reasoning for m in ms], rea),
        "update_s": max(m.update_s for m in ms),
        # token-weighted over ranks (exact at level token; at the sequence levels a close weighting)
        "is_ratio_mean": _wmean([m.is_ratio_mean for m in ms], tok),
        "is_ratio_max": max(m.is_ratio_max for m in ms),
        "is_capped_fraction": _wmean([m.is_capped_fraction for m in ms], tok),
        "mismatch_kl_k1": _wmean([m.mismatch_kl_k1 for m in ms], tok),
        "mismatch_kl_k3": _wmean([m.mismatch_kl_k3 for m in ms], tok),
    }
    if not m0.skipped:
        for k in ("loss", "pg_loss", "kl", "clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"):
            out[k] = sum(getattr(m, k) for m in ms)
    out["tokens_per_s"] = (sum(m.tokens_per_s * m.update_s for m in ms) / out["update_s"]
                           if out["update_s"] else 0.0)
    if m0.skipped:  # the base reports 1.0 / NaN placeholders then; keep them
        for k in ("aem_alpha_mean", "actfocus_weight_action", "actfocus_weight_reasoning", "entropy",
                  "energy_action", "energy_reasoning"):
            out[k] = getattr(m0, k)
    if all(c is not None for c in corr):
        out.update(energy_metrics(merge_group_energies(corr)))  # type: ignore[arg-type]
    known = {f.name for f in fields(UpdateMetrics)}
    return replace(m0, **{k: v for k, v in out.items() if k in known})


def energy_metrics(g: GroupEnergies) -> dict[str, Any]:
    """The UpdateMetrics fields of the energy–reward-variance diagnostic for the groups `g`."""
    c = g.correlations()
    return dict(energy_reward_corr_pearson=c["action_pearson"],
                energy_reward_corr_spearman=c["action_spearman"],
                energy_reward_corr_reasoning_pearson=c["reasoning_pearson"],
                energy_reward_corr_reasoning_spearman=c["reasoning_spearman"],
                energy_reward_corr_groups=sum(math.isfinite(e) for e in g.action),
                group_energy_action=g.action, group_energy_reasoning=g.reasoning,
                group_reward_var=g.reward_var)
