"""PrefixCache, the store behind HFEngine's prefix caching: which entry a prompt gets, what it costs."""

from __future__ import annotations

import pytest
import torch

from swerl.rollout.prefix_cache import PrefixCache, PrefixEntry


def entry(tokens: tuple[int, ...], layers: int = 2) -> PrefixEntry:
    """Keys hold each position's token id, so a test can see which positions came back."""
    k = torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(1, len(tokens), 2).clone()
    return PrefixEntry(tokens=tokens, kv=tuple((k, -k) for _ in range(layers)))


def test_the_longest_entry_that_starts_the_prompt_is_taken_out():
    cache = PrefixCache(max_bytes=1 << 20)
    for t in [(1, 2), (1, 2, 3, 4), (1, 9, 3), (5,)]:
        cache.put(entry(t))
    hit = cache.take([1, 2, 3, 4, 5, 6])
    assert hit is not None and hit.length == 4
    assert hit.kv[1][0][0, :, 0].tolist() == [1, 2, 3, 4]
    assert hit.kv[1][1][0, :, 0].tolist() == [-1, -2, -3, -4]
    assert len(cache) == 3  # taken out: the episode's next entry supersedes it
    assert cache.take([1, 2, 3, 4, 5, 6]).length == 2  # the next best
    assert cache.take([7, 8]) is None and cache.take([1, 8, 3]) is None


def test_an_entry_as_long_as_the_prompt_leaves_its_last_token_to_prefill():
    cache = PrefixCache(max_bytes=1 << 20)
    cache.put(entry((1, 2, 3)))
    hit = cache.take([1, 2, 3])
    assert hit.length == 2 and hit.kv[0][0].shape == (1, 2, 2)
    cache.put(entry((4,)))
    assert cache.take([4]) is None  # nothing left to cache: the one token is the prefill


def test_the_oldest_entries_go_first_and_nothing_larger_than_the_cache_is_kept():
    one = entry((1, 2, 3)).nbytes  # 2 layers x (keys + values) x 3 positions x 2 floats x 4 bytes = 96
    assert one == 2 * 2 * 3 * 2 * 4
    cache = PrefixCache(max_bytes=2 * one)
    for t in [(1, 2, 3), (4, 5, 6), (7, 8, 9)]:
        cache.put(entry(t))
    assert len(cache) == 2 and cache.nbytes == 2 * one
    assert cache.take([1, 2, 3, 0]) is None and cache.take([4, 5, 6, 0]).length == 3
    cache.put(entry(tuple(range(10, 20))))  # 320 bytes > 192
    assert len(cache) == 1 and cache.nbytes == one
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        PrefixCache(-1)
