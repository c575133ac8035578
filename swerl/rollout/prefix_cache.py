"""`PrefixCache`: the KV an episode already paid for, kept between its turns by `HFEngine`.

An agent's prompt at turn k+1 is its prompt at turn k, the tokens it generated, and the observation
(swerl keeps trajectories token-exact, so this holds token for token). Without a cache every turn
prefills the whole conversation again, and on CPU that prefill is most of a turn. So when a request
finishes, the engine keeps the keys and values of every token it fed through the model (the prompt and
all generated tokens but the last, which was sampled, never fed), and a later request whose prompt
starts with those tokens prefills only the rest (SGLang's radix cache and vLLM's prefix caching do
the same on the servers, across requests in general).

Entries are per request, not shared: a hit takes the entry out (the episode's next entry supersedes
it), and the oldest entries go first once `max_bytes` is reached. New weights make every entry stale:
the engine clears the cache on each weight update.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefixEntry:
    """The keys and values of `tokens`, one (keys, values) pair per layer, each (kv_heads, len, head_dim)."""

    tokens: tuple[int, ...]
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


@dataclass(frozen=True)
class PrefixHit:
    """How much of a prompt comes from the cache: its first `length` tokens, with their keys and values."""

    length: int
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer, each (kv_heads, length, head_dim)


class PrefixCache:
    """Entries by insertion order (oldest evicted first), at most `max_bytes` of tensors in all."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"PrefixCache.max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._next = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, prompt: list[int]) -> PrefixHit | None:
        """The longest entry that starts `prompt`, removed from the cache; None when there is none. At
        least the prompt's last token is left to prefill: the next token's logits come from it."""
        best_key, best = None, None
        for key, e in self._entries.items():
            n = len(e.tokens)
            # the last token first: a cheap test that rules out almost every other episode's entry
            if n <= len(prompt) and (best is None or n > len(best.tokens)) and \
                    prompt[n - 1] == e.tokens[-1] and tuple(prompt[:n]) == e.tokens:
                best_key, best = key, e
        if best is None or best_key is None:
            return None
        del self._entries[best_key]
        self.nbytes -= best.nbytes
        length = min(len(best.tokens), len(prompt) - 1)
        if length <= 0:
            return None
        kv = tuple((k[:, :length], v[:, :length]) for k, v in best.kv)
        return PrefixHit(length=length, kv=kv)

    def put(self, entry: PrefixEntry) -> None:
        """Keep `entry`, evicting the oldest entries until it fits (never stored when it alone exceeds
        `max_bytes`)."""
        size = entry.nbytes
        if size > self.max_bytes or not entry.tokens:
            return
        while self._entries and self.nbytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
        self._entries[self._next] = entry
        self._next += 1
        self.nbytes += size

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
