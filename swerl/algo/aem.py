"""AEM: Adaptive Entropy Modulation of advantages (arXiv 2605.00425; summary in papers/aem.md).

For each response i (one agent turn) in a rollout group G:
    H̄_i = mean token entropy of the response
    H̃_i = (H̄_i − min_G H̄) / (max_G H̄ − min_G H̄)            (0 when all H̄ in G are equal)
    α_i = exp(−λ·H̃_i) / mean_{j∈G} exp(−λ·H̃_j)              (so α averages 1 over G)
    A_AEM = α_i · A_episode, applied to every token of response i.

The group G of a response is the rollout group of the episode it belongs to: the responses of all
episodes of one task's group are normalised together (pass episode_group[responses.episode]).
"""

from typing import NamedTuple

import torch
from torch import Tensor

from swerl.algo._checks import bool_mask, check_finite, check_number, check_same_shape, check_tensor


class ResponseEntropy(NamedTuple):
    """Per-response view of a (B, T) batch; one entry per (episode row, turn) holding masked tokens.

    Entries are sorted by episode, then turn.
    """

    entropy: Tensor  # (R,) mean token entropy of the response
    episode: Tensor  # (R,) long, batch row of the episode
    turn: Tensor  # (R,) long, turn number within the episode


def _check_turns(turn_index: Tensor, valid: Tensor) -> None:
    if bool((turn_index < 0)[valid].any()):
        raise ValueError("turn_index must be >= 0 wherever mask is nonzero (masked tokens belong to a turn)")


def response_mean_entropy(token_entropy: Tensor, turn_index: Tensor, mask: Tensor) -> ResponseEntropy:
    """Mean token entropy of each response (agent turn), AEM step 1.

    Args:
        token_entropy: (B, T) per-token entropy of the policy (e.g. TokenStats.entropy).
        turn_index: (B, T) integer turn number of each token within its episode; ignored where
            mask is 0 (prompt, observations, padding may hold −1 or anything).
        mask: (B, T) 0/1, the model-generated tokens that make up the responses.

    Returns:
        ResponseEntropy with R = number of (episode, turn) pairs that have at least one masked token.
    """
    check_tensor(token_entropy, "token_entropy", ndim=2, kind="float")
    check_tensor(turn_index, "turn_index", kind="int")
    check_same_shape(turn_index, "turn_index", token_entropy, "token_entropy")
    valid = bool_mask(mask, "mask", token_entropy.shape)  # (B, T)
    _check_turns(turn_index, valid)
    check_finite(token_entropy, "token_entropy", where=valid)

    batch = token_entropy.shape[0]
    rows = torch.arange(batch, device=token_entropy.device)[:, None].expand_as(turn_index)[valid]  # (M,)
    turns = turn_index[valid].long()  # (M,)
    ent = token_entropy.detach()[valid]  # (M,)
    if turns.numel() == 0:
        empty = turns.new_empty(0)
        return ResponseEntropy(ent.new_empty(0), empty, empty.clone())
    # one integer key per (episode, turn); sorting by key sorts by episode, then turn
    stride = int(turns.max()) + 1
    keys, inverse = torch.unique(rows * stride + turns, return_inverse=True)  # (R,), (M,)
    sums = ent.new_zeros(keys.numel()).index_add_(0, inverse, ent)
    counts = torch.bincount(inverse, minlength=keys.numel())
    return ResponseEntropy(sums / counts, keys // stride, keys % stride)


def aem_coefficients(response_entropy: Tensor, group_index: Tensor, lam: float) -> Tensor:
    """AEM steps 2–3: α per response from its mean entropy, normalised within its group.

    Args:
        response_entropy: (R,) mean token entropy of each response (ResponseEntropy.entropy).
            Treated as a constant: α carries no gradient.
        group_index: (R,) integer label of the rollout group of the episode each response belongs
            to (responses of all episodes in a group form one G); any labelling.
        lam: temperature λ; 0 gives α = 1, larger λ favours low-entropy (confident) responses.

    Returns:
        (R,) α > 0 with mean exactly 1 (up to rounding) over each group. Groups whose entropies are
        all equal (including single-response groups) get α = 1.
    """
    check_tensor(response_entropy, "response_entropy", ndim=1, kind="float")
    check_tensor(group_index, "group_index", ndim=1, kind="int")
    check_same_shape(group_index, "group_index", response_entropy, "response_entropy")
    lam = check_number(lam, "lam")
    ent = response_entropy.detach()
    check_finite(ent, "response_entropy")

    inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)[1:]
    num_groups = counts.numel()
    gmax = ent.new_empty(num_groups).scatter_reduce_(0, inverse, ent, "amax", include_self=False)
    gmin = ent.new_empty(num_groups).scatter_reduce_(0, inverse, ent, "amin", include_self=False)
    low, span = gmin[inverse], (gmax - gmin)[inverse]  # (R,)
    normalised = torch.where(span > 0, (ent - low) / torch.where(span > 0, span, 1.0), 0.0)
    weight = torch.exp(-lam * normalised)  # (R,)
    group_mean = ent.new_zeros(num_groups).index_add_(0, inverse, weight) / counts
    return weight / group_mean[inverse]


def aem_token_advantages(
    episode_adv: Tensor,
    alpha: Tensor,
    responses: ResponseEntropy,
    turn_index: Tensor,
    mask: Tensor,
) -> Tensor:
    """AEM step 4: per-token advantages α_turn · A_episode.

    Args:
        episode_adv: (B,) advantage of each episode (e.g. from group_advantages).
        alpha: (R,) α of each response (aem_coefficients), aligned with `responses`.
        responses: the (episode, turn) of each response, as returned by response_mean_entropy.
        turn_index: (B, T) integer turn of each token (ignored where mask is 0).
        mask: (B, T) 0/1 model-generated tokens.

    Returns:
        (B, T) advantages; 0 where mask is 0.
    """
    check_tensor(episode_adv, "episode_adv", ndim=1, kind="float")
    check_tensor(turn_index, "turn_index", ndim=2, kind="int")
    if turn_index.shape[0] != episode_adv.shape[0]:
        raise ValueError(
            f"turn_index must have B={episode_adv.shape[0]} rows like episode_adv, got {tuple(turn_index.shape)}"
        )
    valid = bool_mask(mask, "mask", turn_index.shape)
    check_tensor(alpha, "alpha", ndim=1, kind="float")
    check_same_shape(alpha, "alpha", responses.episode, "responses.episode")
    check_same_shape(responses.turn, "responses.turn", responses.episode, "responses.episode")
    check_finite(alpha, "alpha")
    check_finite(episode_adv, "episode_adv")
    _check_turns(turn_index, valid)
    batch = turn_index.shape[0]
    if responses.episode.numel() and (
        int(responses.episode.min()) < 0
        or int(responses.episode.max()) >= batch
        or int(responses.turn.min()) < 0
    ):
        raise ValueError(f"responses.episode must lie in [0, {batch}) and responses.turn be >= 0")

    turns = torch.where(valid, turn_index.long(), 0)  # (B, T)
    stride = int(torch.cat([turns.flatten(), responses.turn.long(), turns.new_zeros(1)]).max()) + 1
    # α looked up per token through an (episode, turn) table; NaN marks turns with no response
    table = alpha.new_full((batch * stride,), float("nan"))
    table[responses.episode.long() * stride + responses.turn.long()] = alpha.detach()
    rows = torch.arange(batch, device=turn_index.device)[:, None]
    token_alpha = table[rows * stride + turns]  # (B, T)
    missing = torch.isnan(token_alpha) & valid
    if bool(missing.any()):
        raise ValueError(
            f"responses has no entry for {int(missing.sum())} masked token(s): every (episode, turn) "
            "under mask must come from response_mean_entropy on the same turn_index and mask"
        )
    adv = token_alpha * episode_adv.detach()[:, None].to(alpha.dtype)
    return torch.where(valid, adv, torch.zeros_like(adv))


def aem_advantages(
    episode_adv: Tensor,
    episode_group: Tensor,
    token_entropy: Tensor,
    turn_index: Tensor,
    mask: Tensor,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """The whole of AEM for a (B, T) batch: per-token advantages and the α of each response.

    Args:
        episode_adv: (B,) episode advantages. episode_group: (B,) rollout-group label per episode.
        token_entropy, turn_index, mask: (B, T), as in response_mean_entropy. lam: temperature λ.

    Returns:
        ((B, T) token advantages, (R,) α per response in response_mean_entropy's order).
    """
    check_tensor(episode_adv, "episode_adv", ndim=1, kind="float")
    check_tensor(episode_group, "episode_group", ndim=1, kind="int")
    check_same_shape(episode_group, "episode_group", episode_adv, "episode_adv")
    check_tensor(token_entropy, "token_entropy", ndim=2)
    if token_entropy.shape[0] != episode_adv.shape[0]:
        raise ValueError(
            f"token_entropy must have B={episode_adv.shape[0]} rows like episode_adv, "
            f"got {tuple(token_entropy.shape)}"
        )
    responses = response_mean_entropy(token_entropy, turn_index, mask)
    alpha = aem_coefficients(responses.entropy, episode_group[responses.episode], lam)
    return aem_token_advantages(episode_adv, alpha, responses, turn_index, mask), alpha
