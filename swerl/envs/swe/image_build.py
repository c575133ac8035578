"""The lowest layer of SWE image building: `ImageUnavailable`, `docker build` contexts held in memory, and
network-less builds cached by a content label (`build_cached_image`), one at a time per tag. Both the
instance images (`swerl.envs.swe.images`) and their scrubbed layers (`swerl.envs.swe.scrub`) build with
it."""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Callable
from typing import Any

import docker.errors

from swerl.sandbox.errors import SandboxError
from swerl.sandbox.images import LABEL_HASH

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class ImageUnavailable(SandboxError):
    """No image for an instance: not on this machine, not pullable, and no recipe to build it."""


def build_context(files: dict[str, str]) -> io.BytesIO:
    """A `docker build` context (a tar in memory) of text files by path."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in files.items():
            data = text.encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def lock(key: str) -> threading.Lock:
    """One lock per key (an image tag, a folder): one build of it at a time in this process."""
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def build_cached_image(client: Any, tag: str, digest: str, files: dict[str, str], *,
                       failed: Callable[[str, str], Exception], label: str = LABEL_HASH) -> str | None:
    """Build the context `files` (a Dockerfile and what it copies) as `tag`, with no network, unless an
    image `tag` whose `label` is `digest` exists already; one build per tag at a time. Returns the build
    output, or None when the image was cached. A failed build raises `failed(error, output)`."""
    with lock(tag):
        try:
            if (client.images.get(tag).labels or {}).get(label) == digest:
                return None
        except docker.errors.ImageNotFound:
            pass
        out: list[str] = []
        try:
            for chunk in client.api.build(fileobj=build_context(files), custom_context=True, tag=tag, rm=True,
                                          forcerm=True, decode=True, network_mode="none"):
                if "stream" in chunk:
                    out.append(chunk["stream"])
                if "error" in chunk:
                    raise failed(chunk["error"].strip(), "".join(out))
        except docker.errors.APIError as e:
            raise failed(str(e), "".join(out)) from e
    return "".join(out)
