"""The ActFocus diagnostic (arXiv 2605.14558): does the frozen reference's uncertainty point at the
groups that carry the learning signal?

* `energy_reward_correlation`: the correlation across rollout groups between a group's mean
  action-token energy (under the frozen reference) and the variance of its rewards. A positive value
  says the groups whose actions the reference is unsure about are the groups where the outcome is
  undecided, i.e. where the learning signal is.
* `group_energy_reward_stats`: the per-group inputs of that correlation, from the learner's tensors.

Pure functions, no I/O; shapes: K sequences of T tokens, G rollout groups. Logging the results is
`swerl.runlog`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

_NAN = float("nan")


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    # x, y: (n,) paired samples; NaN when either side is constant
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 0 or syy <= 0:
        return _NAN
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def rank(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values get the mean of the ranks they span (as Spearman's rho needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def energy_reward_correlation(energy: Sequence[float], reward_var: Sequence[float],
                              min_groups: int = 3) -> tuple[float, float]:
    """(Pearson, Spearman) correlation across groups of `energy[g]` (group g's mean action-token energy)
    and `reward_var[g]` (the variance of group g's rewards).

    Groups with a non-finite value (e.g. no action tokens) are dropped first. Both are NaN when fewer
    than `min_groups` groups remain or either side has zero variance (a correlation is undefined).
    Spearman is Pearson on the ranks (ties get mean ranks).
    """
    if len(energy) != len(reward_var):
        raise ValueError(f"energy has {len(energy)} groups but reward_var has {len(reward_var)}")
    pairs = [(float(e), float(v)) for e, v in zip(energy, reward_var, strict=True)
             if math.isfinite(e) and math.isfinite(v)]
    if len(pairs) < max(min_groups, 2):
        return _NAN, _NAN
    x = [p[0] for p in pairs]
    y = [p[1] for p in pairs]
    pearson = _pearson(x, y)
    if math.isnan(pearson):
        return _NAN, _NAN
    return pearson, _pearson(rank(x), rank(y))


def group_energy_reward_stats(energy: Tensor, action: Tensor, rewards: Tensor,
                              group: Tensor) -> tuple[list[float], list[float]]:
    """Per rollout group (in order of first appearance): the mean energy over all the group's action
    tokens (NaN when it has none) and the population variance of its episode rewards.

    energy, action: (K, T) per-token energy and action-token mask; rewards, group: (K,).
    Returns two lists of length G (the number of distinct groups).
    """
    action = action.bool()  # (K, T)
    tok_energy = torch.where(action, energy.float(), 0).sum(1)  # (K,)
    tok_count = action.sum(1)  # (K,)
    energies, variances = [], []
    for g in dict.fromkeys(group.tolist()):
        rows = group == g
        n = int(tok_count[rows].sum())
        energies.append(float(tok_energy[rows].sum()) / n if n else _NAN)
        r = rewards[rows].double()
        variances.append(float(((r - r.mean()) ** 2).mean()))
    return energies, variances


@dataclass(frozen=True)
class GroupEnergies:
    """Per rollout group (same order in each field): the mean reference energy of its action tokens and
    of its reasoning tokens (NaN where it has none), and the population variance of its rewards. The
    inputs of the energy–reward-variance correlation, kept so that runs can pool them across steps."""

    action: tuple[float, ...]
    reasoning: tuple[float, ...]
    reward_var: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.action) == len(self.reasoning) == len(self.reward_var):
            raise ValueError("GroupEnergies fields must have one entry per group")

    def correlations(self) -> dict[str, float]:
        """Pearson and Spearman across groups, for action and for reasoning tokens."""
        pa, sa = energy_reward_correlation(self.action, self.reward_var)
        pr, sr = energy_reward_correlation(self.reasoning, self.reward_var)
        return {"action_pearson": pa, "action_spearman": sa, "reasoning_pearson": pr,
                "reasoning_spearman": sr}


def group_energies(energy: Tensor, action: Tensor, reasoning: Tensor, rewards: Tensor,
                   group: Tensor) -> GroupEnergies:
    """`group_energy_reward_stats` for action and reasoning tokens at once.

    energy, action, reasoning: (K, T) per-token energy and span masks; rewards, group: (K,)."""
    act, var = group_energy_reward_stats(energy, action, rewards, group)
    rea, _ = group_energy_reward_stats(energy, reasoning, rewards, group)
    return GroupEnergies(tuple(act), tuple(rea), tuple(var))


def merge_group_energies(parts: Sequence[GroupEnergies]) -> GroupEnergies:
    """One GroupEnergies over the groups of all `parts` (e.g. the ranks' disjoint groups)."""
    return GroupEnergies(tuple(x for p in parts for x in p.action),
                         tuple(x for p in parts for x in p.reasoning),
                         tuple(x for p in parts for x in p.reward_var))


def correlation_ci(r: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Two-sided confidence interval of a Pearson correlation `r` over `n` pairs by Fisher's z
    transform (atanh(r) ± z / sqrt(n - 3); default 95%); (NaN, NaN) when n <= 3 or r is NaN."""
    if n <= 3 or not math.isfinite(r):
        return _NAN, _NAN
    r = max(-0.999999, min(0.999999, r))
    c, h = math.atanh(r), z / math.sqrt(n - 3)
    return math.tanh(c - h), math.tanh(c + h)
