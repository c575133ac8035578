"""Checkpoints in a run directory: `<run_dir>/checkpoints/step_00000012/state.pt`, written atomically.

A checkpoint is written into a hidden temporary directory next to its final place, every file and
the directory fsync'ed, then renamed into place (rename is atomic on POSIX), so a crash leaves
either the previous set of checkpoints or the new one complete, never a torn one. `latest_checkpoint`
only ever sees complete checkpoints; leftover temporary directories are ignored (and removed on the
next save).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.pt"
_PREFIX = "step_"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory; on success fsync it and rename it to `final` (replacing it)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
            old = final.parent / f".old-{final.name}-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def checkpoint_root(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first, as (step, directory)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.name.startswith(_PREFIX) and (p / STATE_FILE).is_file():
            with contextlib.suppress(ValueError):
                out.append((int(p.name[len(_PREFIX):]), p))
    return sorted(out)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def agreed_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint that every rank finds complete in its own `run_dir` (collective under a
    process group; in one process, `latest_checkpoint`). With no shared filesystem each node lists its
    own disk, and a node that lost its newest checkpoint (a crash between two nodes' renames, a wiped
    disk) makes every rank resume from the newest one they all hold."""
    from swerl.learner import dist

    steps = dist.all_gather_object([step for step, _ in list_checkpoints(run_dir)])
    common = set(steps[0]).intersection(*steps[1:])
    return checkpoint_root(run_dir) / f"{_PREFIX}{max(common):08d}" if common else None


def save_checkpoint(run_dir: str | os.PathLike[str], step: int, state: dict[str, Any], *,
                    keep_last: int = 0) -> Path:
    """Write `state` (torch-serialisable) as the checkpoint of `step`; keep only the newest
    `keep_last` checkpoints when keep_last > 0. Returns the checkpoint directory."""
    root = checkpoint_root(run_dir)
    final = root / f"{_PREFIX}{step:08d}"
    for stale in root.glob(".tmp-*") if root.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)
    with atomic_dir(final) as tmp:
        torch.save(state, tmp / STATE_FILE)
    if keep_last > 0:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state saved in a checkpoint directory (tensors on CPU)."""
    f = Path(path) / STATE_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f} does not exist: not a complete checkpoint")
    return torch.load(f, map_location="cpu", weights_only=False)
