"""swerl.rollout.kv_cache: a KV cache layer that writes each decode step in place holds what transformers'
concatenating layer holds, through the batch edits the hf engine makes; the engine decodes the same with
it as without."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rollout_helpers import greedy_reference, teacher_forced_logprobs
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from swerl.rollout import HFEngine
from swerl.rollout.kv_cache import GrowingLayer, grow_in_place, is_plain
from swerl.structs import SamplingParams


def _kv(b: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g)


def test_a_growing_layer_holds_what_concatenation_holds_through_the_engines_edits():
    plain, grown = DynamicLayer(), GrowingLayer(headroom=2)
    buffers = set()

    def step(n: int, seed: int) -> None:
        k, v = _kv(len(plain.keys) if plain.is_initialized else 3, n, seed)
        a, b = plain.update(k, v), grown.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert b[0] is grown.keys and b[1] is grown.values  # what readers get is what the layer holds
        buffers.add(grown.keys.data_ptr())

    step(5, 0)  # the prompt
    for i in range(6):  # headroom 2: the buffer is reallocated every third step, written in place between
        step(1, i + 1)
    assert len(buffers) == 3
    # rows leave (the engine's `select`), then the padding they alone had is cut: both copy or view
    keep = torch.tensor([2, 0])
    plain.batch_select_indices(keep), grown.batch_select_indices(keep)
    plain.keys, plain.values = plain.keys[:, :, 3:], plain.values[:, :, 3:]
    grown.keys, grown.values = grown.keys[:, :, 3:], grown.values[:, :, 3:]
    for i in range(3):
        step(1, 10 + i)
    assert plain.keys.shape == (2, 2, 11 - 3 + 3, 4)


def test_grow_in_place_swaps_plain_layers_only_and_keeps_their_tensors():
    k, v = _kv(2, 3, 0)
    cache = DynamicCache([(k, v)])
    cache.layers.append(DynamicSlidingWindowLayer(sliding_window=4))
    keys, values = cache.layers[0].keys, cache.layers[0].values
    grow_in_place(cache, headroom=8)
    first, second = cache.layers
    assert isinstance(first, GrowingLayer) and first.keys is keys and first.values is values
    assert torch.equal(keys, k) and torch.equal(values, v)
    assert type(second) is DynamicSlidingWindowLayer
    assert is_plain(first) and not is_plain(second) and is_plain(DynamicLayer())
    with pytest.raises(ValueError, match="headroom"):
        GrowingLayer(headroom=0)


@pytest.mark.parametrize("kv_headroom", [1, 0])
def test_the_engine_decodes_the_same_with_and_without_room_to_grow(tiny_model_dir, tok, reference_model,
                                                                   kv_headroom):
    # headroom 1: the cache is reallocated every other step, and rows leave the batch at different lengths
    # (after 3, 6, 9 and 14 tokens); 0: transformers' own layers. Requests joining a running batch meet
    # the growing layers in test_rollout_hf (the engine's default headroom).
    engine = HFEngine(tiny_model_dir, seed=0, continuous=True, kv_headroom=kv_headroom)
    texts = ["def mean(values):", "The quick brown fox jumps over the lazy dog. " * 3, "x", "import os"]
    ps = [tok(t)["input_ids"] for t in texts]
    budgets = [3, 14, 9, 6]

    async def go():
        return await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=0.0, max_new_tokens=n))
                                      for p, n in zip(ps, budgets, strict=True)))

    gens = asyncio.run(go())
    asyncio.run(engine.close())
    for p, n, g in zip(ps, budgets, gens, strict=True):
        assert list(g.token_ids) == greedy_reference(reference_model, p, n)
        # two fp32 passes over the same weights: see rollout_helpers for the tolerance
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, p, list(g.token_ids)),
                                           abs=2e-4)
