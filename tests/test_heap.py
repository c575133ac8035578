"""swerl.heap: free pages inside glibc's heap go back to the OS, so a process holds what it uses."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = """
import ctypes, sys
from pathlib import Path

from swerl.heap import release_free_memory


def rss_mib():
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) // 1024


libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
big, small = [], []
for _ in range(256):  # 1 MiB blocks, each followed by a small live one: the heap's top cannot shrink
    p = libc.malloc(1 << 20)
    ctypes.memset(p, 1, 1 << 20)  # touched: resident
    big.append(p)
    small.append(libc.malloc(64))
for p in big:
    libc.free(p)
before = rss_mib()
released = release_free_memory()
print(before, rss_mib(), released)
"""


def test_free_blocks_between_live_ones_are_given_back():
    # glibc's own thresholds pinned so that the 1 MiB blocks come from the heap and free() trims nothing
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
           "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    before, after, released = out.stdout.split()
    assert int(before) - int(after) >= 200  # of the 256 MiB freed
    assert released == "True"
