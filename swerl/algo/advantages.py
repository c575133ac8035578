"""Group-relative advantages and DAPO's batch shaping (one value per episode).

References:
    GRPO: Shao et al. 2024, DeepSeekMath (arXiv 2402.03300), §4.1.2 outcome supervision.
    Dr.GRPO: Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783).
    RLOO: Ahmadian et al. 2024, Back to Basics (arXiv 2402.14740).
    DAPO: Yu et al. 2025 (arXiv 2503.14476), §3.2 dynamic sampling, §3.4 overlong reward shaping.
"""

import torch
from torch import Tensor

from swerl.algo._checks import (
    DeferredChecks,
    check_choice,
    check_number,
    check_same_shape,
    check_tensor,
)

ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce")


def group_ids(labels: Tensor) -> tuple[Tensor, Tensor]:
    """Dense group ids and group sizes for any integer labelling of N items, without a host sync.

    Returns (inverse, counts): inverse (N,) holds the rank of each item's label among the distinct
    labels (what torch.unique(return_inverse=True) gives), counts (N,) the size of each group id,
    zero past the number of groups. Unlike torch.unique the output size does not depend on the data,
    so nothing waits for the device: callers reduce into N buckets, some of them unused.
    """
    n = labels.numel()
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long, device=labels.device)
        return empty, empty.clone()
    ordered, order = torch.sort(labels)
    rank = torch.zeros(n, dtype=torch.long, device=labels.device)
    torch.cumsum(ordered[1:] != ordered[:-1], dim=0, out=rank[1:])
    inverse = torch.empty_like(rank).scatter_(0, order, rank)
    counts = torch.zeros_like(rank).index_add_(0, inverse, torch.ones_like(rank))
    return inverse, counts


def _group_sum(values: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    return values.new_zeros(num_groups).index_add_(0, inverse, values)  # (G,)


def _check_rewards(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, DeferredChecks]:
    """Shape/dtype checks now; the finiteness of rewards is queued on the returned checks."""
    check_tensor(rewards, "rewards", ndim=1)
    check_tensor(group_index, "group_index", ndim=1, kind="int")
    check_same_shape(group_index, "group_index", rewards, "rewards")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    checks = DeferredChecks()
    checks.finite(rewards, "rewards")
    return rewards, checks


def group_advantages(
    rewards: Tensor,
    group_index: Tensor,
    estimator: str = "grpo",
    *,
    eps: float = 1e-6,
    std_normalize: bool = True,
) -> Tensor:
    """One advantage per episode from its reward and the rewards of its rollout group.

    Args:
        rewards: (N,) one scalar reward per episode (integer rewards are cast to float).
        group_index: (N,) integer group label per episode; any labelling (unsorted, gaps) works.
        estimator: "grpo": (r − mean_G r) / (std_G r + eps), std unbiased (GRPO, arXiv 2402.03300);
            "drgrpo": r − mean_G r (Dr.GRPO, arXiv 2503.20783; ignores std_normalize);
            "rloo": r − mean of the other members of the group (arXiv 2402.14740);
            "reinforce": r itself (no baseline).
        eps: added to the group std (grpo only).
        std_normalize: grpo only; False gives Dr.GRPO. Ignored by the other estimators.

    Returns:
        (N,) advantages, dtype of rewards. A group of one gets 0 under grpo/drgrpo/rloo: it has no
        baseline to compare against.
    """
    rewards, checks = _check_rewards(rewards, group_index)
    try:
        check_choice(estimator, "estimator", ESTIMATORS)
        eps = check_number(eps, "eps", min_value=0.0)
    except ValueError:
        checks.check()  # bad rewards are reported first, as when checks ran in order
        raise
    if estimator == "reinforce":
        checks.check()
        return rewards.clone()

    # N buckets, one per group id; the unused ones (counts 0) are never read back
    inverse, counts = group_ids(group_index)  # (N,), (N,)
    num_groups = counts.numel()
    size = counts[inverse]  # (N,) size of each episode's group
    # fp64 group statistics: in fp32 a group of equal rewards (0.1, 0.1, ...) has a mean off by
    # an ulp, and (r − mean) / (std + eps) would blow that up to a sizeable advantage
    r64 = rewards.double()
    sums = _group_sum(r64, inverse, num_groups)  # (G,)
    if estimator == "rloo":
        others_mean = (sums[inverse] - r64) / (size - 1).clamp(min=1)
        adv = r64 - others_mean
    else:
        centred = r64 - (sums / counts)[inverse]  # (N,)
        if estimator == "grpo" and std_normalize:
            # clamp keeps singleton groups finite; they are zeroed below anyway
            var = _group_sum(centred.square(), inverse, num_groups) / (counts - 1).clamp(min=1)
            adv = centred / (var.sqrt()[inverse] + eps)
        else:
            adv = centred
    out = torch.where(size > 1, adv, 0.0).to(rewards.dtype)
    checks.check()  # the only host sync, after all the work is queued
    return out


def dapo_keep_mask(rewards: Tensor, group_index: Tensor) -> Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476, §3.2): which episodes to keep.

    A group whose rewards are all equal has zero group-relative advantage everywhere and only
    dilutes the batch, so its members are dropped. Singleton groups are kept (nothing to compare).

    Args:
        rewards: (N,) float rewards (exact equality decides "all equal").
        group_index: (N,) integer group labels, any labelling.

    Returns:
        (N,) bool, True for episodes to keep.
    """
    rewards, checks = _check_rewards(rewards, group_index)
    inverse, counts = group_ids(group_index)
    num_groups = counts.numel()
    gmax = rewards.new_empty(num_groups).scatter_reduce_(0, inverse, rewards, "amax", include_self=False)
    gmin = rewards.new_empty(num_groups).scatter_reduce_(0, inverse, rewards, "amin", include_self=False)
    keep = ((gmax != gmin) | (counts == 1))[inverse]
    checks.check()
    return keep


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, factor: float) -> Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, §3.4; verl's overlong_buffer).

    penalty = min(−(L − (max_len − buffer_len)) / buffer_len · factor, 0): zero up to
    max_len − buffer_len, then linear, reaching −factor at L = max_len. Like verl (and unlike the
    paper's piecewise form) it is not clamped at −factor beyond max_len; with generation capped at
    max_len that case does not arise. Add the result to the episode reward.

    Args:
        lengths: (N,) response lengths in tokens, >= 0 (int or float).
        max_len: the maximum response length, > 0.
        buffer_len: the soft buffer before max_len, 0 < buffer_len <= max_len.
        factor: penalty at L = max_len, >= 0.

    Returns:
        (N,) float penalties <= 0 (float32 for integer lengths, else the dtype of lengths).
    """
    check_tensor(lengths, "lengths")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if isinstance(buffer_len, bool) or not isinstance(buffer_len, int) or not 0 < buffer_len <= max_len:
        raise ValueError(
            f"buffer_len must be an int with 0 < buffer_len <= max_len={max_len}, got {buffer_len!r}"
        )
    factor = check_number(factor, "factor", min_value=0.0)
    lengths_f = lengths if lengths.is_floating_point() else lengths.to(torch.float32)
    checks = DeferredChecks()
    checks.finite(lengths_f, "lengths")
    checks.add((lengths_f < 0).any(), lambda: f"lengths must be >= 0, got minimum {lengths_f.min().item()}")
    exceed = lengths_f - (max_len - buffer_len)
    out = (-exceed / buffer_len * factor).clamp(max=0.0)
    checks.check()
    return out
