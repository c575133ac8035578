"""`DiskWatch`: the disk limit of a sandbox command. The writable layer of a container lives on the host's
disk, where ext4 backing gives no quota, so while one command runs its size is measured every
`POLL_S`; past the limit the command is stopped the way a timeout stops it."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable


def tree_bytes(root: str) -> int:
    """Disk blocks (bytes) the files under `root` take, without following links."""
    total = 0
    for d, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                continue
    return total


class DiskWatch:
    """While one command runs: every `POLL_S`, the size of the writable layer `upper`; past `limit` bytes
    the command is interrupted (`signal("SIGUSR1")`, the harness's Ctrl-C), then what remains is killed
    (`signal("SIGUSR2")`) a second later."""

    POLL_S = 0.2

    def __init__(self, upper: str, limit: int, signal: Callable[[str], None], *, name: str = "") -> None:
        self.upper, self.limit, self.signal = upper, limit, signal
        self.hit = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"disk-watch-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_S):
            if tree_bytes(self.upper) > self.limit:
                self.hit = True
                # as on a timeout: Ctrl-C aborts the command line (a loop in the shell itself included),
                # then whatever ignores SIGINT is killed
                with contextlib.suppress(Exception):
                    self.signal("SIGUSR1")
                    if not self._stop.wait(1.0):
                        self.signal("SIGUSR2")
                return

    def finish(self) -> bool:
        """Stop watching; whether the limit was passed (during the command, or by what it left)."""
        self._stop.set()
        self._thread.join()
        return self.hit or tree_bytes(self.upper) > self.limit
