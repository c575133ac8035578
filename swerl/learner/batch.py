"""Trajectories → padded (B, T) tensors, and micro-batches packed by a token budget.

Rows are right-padded, so position ids are plain 0..T−1 and the per-token fields stay in token
positions: `loss_mask[b, t]` says whether token t of row b is in the loss. The learner predicts
token t from the hidden state at t − 1, so a row's first token can never be in the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from swerl.structs import Trajectory


@dataclass(frozen=True)
class Batch:
    """A padded batch of B episodes; every (B, T) field is 0 on padding (turn_index −1)."""

    input_ids: Tensor  # (B, T) long, pad_id on padding
    attention_mask: Tensor  # (B, T) long, 1 on real tokens
    loss_mask: Tensor  # (B, T) long, 1 on model-generated tokens
    span: Tensor  # (B, T) long, 0 other, 1 reasoning, 2 action
    turn_index: Tensor  # (B, T) long, turn of generated tokens, −1 elsewhere
    old_logp: Tensor  # (B, T) float32, engine log-prob of generated tokens, 0 elsewhere
    rewards: Tensor  # (B,) float32 episode rewards
    group: Tensor  # (B,) long rollout-group label of each episode
    lengths: Tensor  # (B,) long real tokens per row

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: Tensor | Sequence[int], *, trim: bool = True) -> Batch:
        """The sub-batch of `rows` (in that order), trimmed to its longest row when `trim`."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[idx].max()) if trim and idx.numel() else self.input_ids.shape[1]
        return Batch(**{
            name: (t[idx, :width] if t.ndim == 2 else t[idx])
            for name, t in self.__dict__.items()
        })


def collate(trajectories: Sequence[Trajectory], groups: Sequence[int], *, pad_id: int = 0) -> Batch:
    """Pad trajectories (each with a reward) into a Batch; `groups[i]` is the rollout group of episode i."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    if len(groups) != len(trajectories):
        raise ValueError(f"collate: {len(trajectories)} trajectories but {len(groups)} group labels")
    lengths = [len(t.token_ids) for t in trajectories]
    width = max(lengths)
    b = len(trajectories)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    span = torch.zeros((b, width), dtype=torch.long)
    turn = torch.full((b, width), -1, dtype=torch.long)
    old = torch.zeros((b, width), dtype=torch.float32)
    rewards = []
    for i, t in enumerate(trajectories):
        if t.reward is None:
            raise ValueError(f"collate: trajectory {i} has no reward (grade it before training)")
        if t.loss_mask and t.loss_mask[0]:
            raise ValueError(f"collate: trajectory {i} has its first token in the loss mask; "
                             "a first token has no context to be predicted from")
        n = lengths[i]
        ids[i, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        m = torch.tensor(t.loss_mask, dtype=torch.long)
        mask[i, :n] = m
        span[i, :n] = torch.tensor(t.span, dtype=torch.long) * m
        turn[i, :n] = torch.where(m.bool(), torch.tensor(t.turn_index, dtype=torch.long), -1)
        old[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32) * m
        rewards.append(float(t.reward))
    return Batch(ids, attn, mask, span, turn, old, torch.tensor(rewards, dtype=torch.float32),
                 torch.as_tensor(list(groups), dtype=torch.long), torch.tensor(lengths, dtype=torch.long))


def pack_micro_batches(lengths: Sequence[int] | Tensor, token_budget: int) -> list[list[int]]:
    """Split rows into micro-batches whose padded size (rows × longest row) fits `token_budget`.

    Rows are taken longest first (so similar lengths share a micro-batch and padding stays small);
    a row longer than the budget gets a micro-batch of its own. Every row appears exactly once.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lens = [int(x) for x in (lengths.tolist() if isinstance(lengths, Tensor) else lengths)]
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    cur_width = 0
    for i in order:
        width = max(cur_width, lens[i])
        if cur and width * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, width = [], lens[i]
        cur.append(i)
        cur_width = width
    if cur:
        out.append(cur)
    return out
