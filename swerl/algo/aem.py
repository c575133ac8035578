"""AEM: Adaptive Entropy Modulation of advantages (arXiv 2605.00425; see docs/aem.md).

For each response i (one agent turn) in a rollout group G:
    H̄_i = mean token entropy of the response
    H̃_i = (H̄_i − min_G H̄) / (max_G H̄ − min_G H̄)            (0 when all H̄ in G are equal)
    α_i = exp(−λ·H̃_i) / mean_{j∈G} exp(−λ·H̃_j)              (so α averages 1 over G)
    A_AEM = α_i · A_episode, applied to every token of response i.

The group G of a response is the rollout group of the episode it belongs to: the responses of all
episodes of one task's group are normalised together (pass episode_group[responses.episode]).

Host syncs: tokens are grouped into a dense (B, max_turn + 1) table of (episode, turn) cells with
index_add (no unique/sort, no boolean-mask gathers), so response_mean_entropy and aem_advantages
sync twice (argument checks together with max_turn, then the nonzero that lists the responses),
aem_coefficients and aem_token_advantages once (argument checks).
"""

from typing import NamedTuple

import torch
from torch import Tensor

from swerl.algo._checks import DeferredChecks, bool_mask, check_number, check_same_shape, check_tensor
from swerl.algo.advantages import group_ids

_TURN_MESSAGE = "turn_index must be >= 0 wherever mask is nonzero (masked tokens belong to a turn)"


class ResponseEntropy(NamedTuple):
    """Per-response view of a (B, T) batch; one entry per (episode row, turn) holding masked tokens.

    Entries are sorted by episode, then turn.
    """

    entropy: Tensor  # (R,) mean token entropy of the response
    episode: Tensor  # (R,) long, batch row of the episode
    turn: Tensor  # (R,) long, turn number within the episode


class _CellTable(NamedTuple):
    """Token entropy summed per (episode, turn) cell of a dense (B, stride) table, flattened."""

    sums: Tensor  # (B * stride,) dtype of token_entropy
    counts: Tensor  # (B * stride,) long, masked tokens per cell (0: no such response)
    cell: Tensor  # (B, T) long, flat cell of each token (an arbitrary cell of its row where mask is 0)
    valid: Tensor  # (B, T) bool mask
    stride: int  # max turn under mask + 1 (1 when the mask is empty)


def _take(x: Tensor, index: Tensor) -> Tensor:
    """x[index] for a 1-D x and an index of any shape; index_select is much faster than x[index] on CPU."""
    return x.index_select(0, index.flatten()).view(index.shape)


def _cell_table(token_entropy: Tensor, turn_index: Tensor, mask: Tensor) -> _CellTable:
    """Checks the inputs of response_mean_entropy and sums entropies per cell; one host sync."""
    check_tensor(token_entropy, "token_entropy", ndim=2, kind="float")
    check_tensor(turn_index, "turn_index", kind="int")
    check_same_shape(turn_index, "turn_index", token_entropy, "token_entropy")
    valid = bool_mask(mask, "mask", token_entropy.shape)  # (B, T)
    turns = torch.where(valid, turn_index, 0)  # (B, T)
    # masked-out tokens add 0 to the first cell of their row below: x + 0 == x, so the sums are
    # those of the masked tokens alone, accumulated in token order
    ent = torch.where(valid, token_entropy.detach(), 0)  # NaN/inf in ent: exactly those under mask
    checks = DeferredChecks()
    if turns.numel() == 0:
        checks.finite(ent, "token_entropy")
        checks.check()
        stride = 1
    else:
        lowest, highest = torch.aminmax(turns)
        checks.add(lowest < 0, lambda: _TURN_MESSAGE)
        checks.finite(ent, "token_entropy")
        (max_turn,) = checks.check(highest)  # the one sync: checks and table width together
        stride = max_turn + 1

    batch = token_entropy.shape[0]
    rows = torch.arange(0, batch * stride, stride, device=token_entropy.device)  # (B,) first cell of each row
    cell = rows[:, None] + turns.long()  # (B, T)
    sums = ent.new_zeros(batch * stride).index_add_(0, cell.flatten(), ent.flatten())
    counts = cell.new_zeros(batch * stride).index_add_(0, cell.flatten(), valid.flatten().long())
    return _CellTable(sums, counts, cell, valid, stride)


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
    table = _cell_table(token_entropy, turn_index, mask)
    # flat cell order is (episode, turn) order; nonzero is the one sync that sizes R
    cells = table.counts.nonzero().squeeze(1)  # (R,)
    return ResponseEntropy(
        table.sums[cells] / table.counts[cells], cells // table.stride, cells % table.stride
    )


def _alpha(entropy: Tensor, inverse: Tensor, num_buckets: int, lam: float) -> Tensor:
    """α of every entry of `entropy` (n,), normalised over its bucket inverse (n,) in [0, num_buckets)."""
    gmax = entropy.new_empty(num_buckets).scatter_reduce_(0, inverse, entropy, "amax", include_self=False)
    gmin = entropy.new_empty(num_buckets).scatter_reduce_(0, inverse, entropy, "amin", include_self=False)
    low, span = gmin[inverse], (gmax - gmin)[inverse]  # (n,)
    normalised = torch.where(span > 0, (entropy - low) / torch.where(span > 0, span, 1.0), 0.0)
    weight = torch.exp(-lam * normalised)  # (n,)
    counts = inverse.new_zeros(num_buckets).index_add_(0, inverse, torch.ones_like(inverse))
    group_mean = entropy.new_zeros(num_buckets).index_add_(0, inverse, weight) / counts
    return weight / group_mean[inverse]


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
    checks = DeferredChecks()
    checks.finite(ent, "response_entropy")
    inverse, _ = group_ids(group_index)  # (R,) in [0, R)
    alpha = _alpha(ent, inverse, inverse.numel(), lam)
    checks.check()
    return alpha


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
            f"turn_index must have B={episode_adv.shape[0]} rows like episode_adv, got "
            f"{tuple(turn_index.shape)}"
        )
    valid = bool_mask(mask, "mask", turn_index.shape)
    check_tensor(alpha, "alpha", ndim=1, kind="float")
    check_same_shape(alpha, "alpha", responses.episode, "responses.episode")
    check_same_shape(responses.turn, "responses.turn", responses.episode, "responses.episode")
    batch = turn_index.shape[0]
    checks = DeferredChecks()
    checks.finite(alpha, "alpha")
    checks.finite(episode_adv, "episode_adv")
    checks.add(((turn_index < 0) & valid).any(), lambda: _TURN_MESSAGE)
    episode, turn = responses.episode.long(), responses.turn.long()
    if episode.numel():
        checks.add(
            ((episode < 0) | (episode >= batch) | (turn < 0)).any(),
            lambda: f"responses.episode must lie in [0, {batch}) and responses.turn be >= 0",
        )

    # α looked up per token by binary search over the responses' (episode, turn) keys: unlike a
    # dense table this needs no table size on the host, so every check is read in one sync below
    turns = torch.where(valid, turn_index.long(), 0)  # (B, T)
    if episode.numel() and turns.numel():
        stride = torch.maximum(turns.amax(), turn.amax()).clamp(min=0) + 1  # 0-dim, on the device
        keys, order = torch.sort(episode * stride + turn, stable=True)  # (R,)
        token_keys = torch.arange(batch, device=turns.device)[:, None] * stride + turns  # (B, T)
        # the last of equal keys, like writing α into a table in response order
        pos = (torch.searchsorted(keys, token_keys, right=True) - 1).clamp(min=0)  # (B, T)
        token_alpha = _take(alpha.detach(), _take(order, pos))
        missing = valid & (_take(keys, pos) != token_keys)
    else:
        token_alpha = alpha.new_zeros(turn_index.shape)
        missing = valid
    checks.add(
        missing.any(),
        lambda: (
            f"responses has no entry for {int(missing.sum())} masked token(s): every (episode, turn) "
            "under mask must come from response_mean_entropy on the same turn_index and mask"
        ),
    )
    adv = token_alpha * episode_adv.detach()[:, None].to(alpha.dtype)
    out = torch.where(valid, adv, 0)
    checks.check()
    return out


def _nonzero_unless(x: Tensor, failed: Tensor) -> tuple[Tensor, bool]:
    """Flat indices of the nonzero entries of x, and bool(failed) (0-dim), in nonzero's one sync.

    `failed` repeated x.numel() + 1 times is appended to x: the output is longer than x alone can
    make it exactly when failed is True, and its length is known on the host once nonzero returns.
    """
    n = x.numel()
    idx = torch.cat([x.flatten(), failed.expand(n + 1)]).nonzero().squeeze(1)
    if idx.numel() > n:
        return idx[: idx.numel() - n - 1], True
    return idx, False


def aem_advantages(
    episode_adv: Tensor,
    episode_group: Tensor,
    token_entropy: Tensor,
    turn_index: Tensor,
    mask: Tensor,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """The whole of AEM for a (B, T) batch: per-token advantages and the α of each response.

    Same results and errors as response_mean_entropy → aem_coefficients(episode_group[episode]) →
    aem_token_advantages, computed on the dense (episode, turn) table: two host syncs in all.

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
    batch = episode_adv.shape[0]
    if token_entropy.shape[0] != batch:
        raise ValueError(
            f"token_entropy must have B={batch} rows like episode_adv, got {tuple(token_entropy.shape)}"
        )
    table = _cell_table(token_entropy, turn_index, mask)  # sync 1: checks and table width
    lam = check_number(lam, "lam")

    present = table.counts > 0  # (B * S,) the cells that are responses
    entropy = table.sums / table.counts  # (B * S,) NaN in the other cells
    # a cell's group is its episode's; cells that are not responses go to an extra bucket, B
    group_of_episode, _ = group_ids(episode_group)  # (B,) in [0, B)
    cell_group = torch.where(present.view(batch, table.stride), group_of_episode[:, None], batch)
    alpha = _alpha(entropy, cell_group.flatten(), batch + 1, lam)  # (B * S,)
    adv = _take(alpha, table.cell) * episode_adv.detach()[:, None].to(alpha.dtype)  # (B, T)
    token_adv = torch.where(table.valid, adv, 0)

    # the checks aem_coefficients and aem_token_advantages make, in their order
    checks = DeferredChecks()
    checks.finite(entropy, "response_entropy", where=present)
    checks.finite(alpha, "alpha", where=present)
    checks.finite(episode_adv, "episode_adv")
    cells, failed = _nonzero_unless(present, checks.any_failed())  # sync 2: (R,) responses and checks
    if failed:
        checks.check()  # raises
    return token_adv, alpha[cells]
