"""This process's C heap: giving its free pages back to the operating system.

On CPU, torch's tensors come from glibc's malloc. Blocks larger than glibc's mmap threshold are mapped
on their own and unmapped when freed, but glibc raises that threshold to the size of each large block
freed (up to 32 MiB), so after a few decode steps the engine's KV caches and the learner's activations
come from the heap, where a free block between live ones stays resident. A SmolLM2 `swerl train` on
2 cores grew to 11.4 GB that way over 4 steps, two runs too many for 24 GB. Returning the free pages at
the ends of phases (an engine with nothing left to decode, a finished update) keeps what is resident
close to what is live, at no cost to a decode step (scripts/bench_heap.py measures both). Fixing the
threshold instead (`MALLOC_MMAP_THRESHOLD_`) made every step's new blocks fresh mappings: rollouts were
~30% slower, measured once on the games of scripts/bench_hf_engine.py. Standard library only, so every
room may use it.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS): nothing to trim through
        return None


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the OS (glibc's `malloc_trim(0)`, which also releases whole
    free pages inside the heap, not only at its top). True when glibc released any; False when it had
    none to release or the C library is not glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
