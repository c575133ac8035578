"""The hf engine's KV cache layers, grown in place.

transformers' `DynamicLayer` appends each decode step's keys and values with `torch.cat`, which copies
the layer's whole cache every token: per step, a batch pays a copy of B × L positions in every layer.
On CPU that copy is the largest cost of a decode step once contexts are long (SmolLM2-135M, 32 rows of
1000 positions: 61% of the step by torch's profiler; scripts/bench_kv_cache.py times a step with each).
`GrowingLayer` keeps its keys and values in a buffer with `headroom` free positions after them, writes
each step's into that space, and exposes the filled part as a view; the buffer is reallocated (one copy)
when the headroom is used up or when the engine replaced the layer's tensors (rows that left the batch,
rows that joined it, padding that was cut: those already copy).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose `update` writes into spare room instead of concatenating; `keys` and
    `values` are the same (B, H, L, D) tensors to every reader, as views of a larger buffer."""

    def __init__(self, headroom: int) -> None:
        super().__init__()
        if headroom < 1:
            raise ValueError(f"GrowingLayer.headroom must be >= 1, got {headroom}")
        self.headroom = headroom
        self._k: torch.Tensor | None = None  # (B, H, capacity, D); keys is a view of its first L positions
        self._v: torch.Tensor | None = None

    def _owns(self, n: int) -> bool:
        """keys / values are the start of this layer's buffers, with room for `n` more positions."""
        k, v = self._k, self._v
        return (k is not None and v is not None and self.keys.data_ptr() == k.data_ptr()
                and self.values.data_ptr() == v.data_ptr() and self.keys.shape[:2] == k.shape[:2]
                and self.keys.stride() == k.stride() and self.values.stride() == v.stride()
                and self.keys.shape[2] + n <= k.shape[2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        filled = self.keys.shape[2] if self.keys.numel() else 0
        if not self._owns(n):
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty((b, h, filled + n + self.headroom, d))
            self._v = value_states.new_empty((b, h, filled + n + self.headroom, value_states.shape[3]))
            if filled:
                self._k[:, :, :filled] = self.keys
                self._v[:, :, :filled] = self.values
        assert self._k is not None and self._v is not None
        self._k[:, :, filled:filled + n] = key_states
        self._v[:, :, filled:filled + n] = value_states
        self.keys, self.values = self._k[:, :, :filled + n], self._v[:, :, :filled + n]
        return self.keys, self.values


def grow_in_place(cache: Any, headroom: int) -> None:
    """Make every plain `DynamicLayer` of `cache` a `GrowingLayer` holding the same keys and values (no
    copy until its next update); other layers (sliding windows) are left as they are."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            grown = GrowingLayer(headroom)
            if layer.is_initialized:
                grown.lazy_initialization(layer.keys, layer.values)
                grown.keys, grown.values = layer.keys, layer.values
            cache.layers[i] = grown


def is_plain(layer: Any) -> bool:
    """A layer that holds every position it was given (no sliding window, no recurrent state)."""
    return type(layer) in (DynamicLayer, GrowingLayer)
