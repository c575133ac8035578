"""A built layer's lock (`swerl.lock` label: the resolved files and their sha256) and `--check`'s
comparison with a fresh resolution."""

from __future__ import annotations

from typing import Any

import docker.errors

from swerl.envs.swe.build.plan import _RESOLVER_PIP, LOCK_LABEL
from swerl.envs.swe.resolve import Resolver, lock_diff
from swerl.sandbox.images import LABEL_HASH


def _image_digest(client: Any, tag: str) -> str | None:
    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return (img.labels or {}).get(LABEL_HASH, "")


def _lock_text(pip: Resolver, files: list[str]) -> list[str]:
    """A layer's lock: what it was resolved against, then its files."""
    return [f"# as-of {pip.index.as_of} python {pip.python} pip-resolver {_RESOLVER_PIP}", *files]


def image_lock(client: Any, image: str) -> list[str] | None:
    """The lock recorded on an image built here (None: no such image, or no lock)."""
    try:
        labels = client.images.get(image).labels or {}
    except docker.errors.ImageNotFound:
        return None
    text = labels.get(LOCK_LABEL)
    return text.splitlines() if text else None


def _compare(client: Any, image: str, digest: str, lock: list[str]) -> list[str]:
    """How `image` differs from a layer resolved again: its hash and its lock, or that it is missing."""
    recorded = image_lock(client, image)
    if recorded is None:
        there = _image_digest(client, image) is not None
        return [f"{image}: {'has no lock (built before locks were recorded)' if there else 'is not built'}"]
    out = [f"{image}: {line}" for line in lock_diff(recorded, lock)]
    if recorded[:1] != lock[:1]:
        out.append(f"{image}: resolved as `{recorded[0]}`, now `{lock[0]}`")
    if not out and _image_digest(client, image) != digest:
        out.append(f"{image}: the same packages, but its build inputs (script, base layer) changed")
    return out
