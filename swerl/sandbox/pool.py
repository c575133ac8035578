"""A warm pool of sandboxes for one spec (one image).

- `acquire()` hands out a sandbox that is already created, started and has its shell ready, so an
  episode does not wait ~300 ms for a container; the pool refills itself in the background.
- A sandbox is never reused: `release()` removes it, and the next episode gets a fresh one.
- At most `max_containers` exist at once (warm + in use + being created), and at most `max_starts`
  are being created at once, so a burst of episodes never overloads the Docker daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self

from swerl.sandbox import lifecycle
from swerl.sandbox.docker_sandbox import DockerSandbox
from swerl.structs import SandboxSpec


class SandboxPool:
    def __init__(self, spec: SandboxSpec, *, warm: int = 2, max_containers: int = 16, max_starts: int = 4,
                 run_id: str | None = None, client: Any = None) -> None:
        if warm < 0 or max_containers < 1 or max_starts < 1:
            raise ValueError(f"need warm >= 0, max_containers >= 1, max_starts >= 1; got {warm}, "
                             f"{max_containers}, {max_starts}")
        if warm > max_containers:
            raise ValueError(f"warm ({warm}) cannot exceed max_containers ({max_containers})")
        self.spec = spec
        self.warm_target = warm
        self.max_containers = max_containers
        self.run_id = run_id or lifecycle.default_run_id()
        self._client = client
        self._cond = asyncio.Condition()
        self._starts = asyncio.Semaphore(max_starts)
        self._warm: list[DockerSandbox] = []
        self._in_use: set[DockerSandbox] = set()
        self._live = 0  # containers that exist or are being created
        self._refilling = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        lifecycle.install_handlers()

    async def __aenter__(self) -> Self:
        self._client = self._client or await asyncio.to_thread(lifecycle.docker_client)
        async with self._cond:
            self._refill()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def live(self) -> int:
        return self._live

    @property
    def warm(self) -> int:
        return len(self._warm)

    async def _create(self) -> DockerSandbox:
        sb = DockerSandbox(self.spec, run_id=self.run_id, client=self._client)
        async with self._starts:
            try:
                await asyncio.to_thread(sb.start)
            except BaseException:
                await asyncio.to_thread(sb.close)
                raise
        return sb

    def _refill(self) -> None:
        """Start background creations up to the warm target. Caller holds the condition lock."""
        while (not self._closed and len(self._warm) + self._refilling < self.warm_target
               and self._live < self.max_containers):
            self._live += 1
            self._refilling += 1
            task = asyncio.get_running_loop().create_task(self._refill_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _refill_one(self) -> None:
        sb = None
        try:
            sb = await self._create()
        finally:
            async with self._cond:
                self._refilling -= 1
                if sb is None or self._closed:
                    self._live -= 1
                else:
                    self._warm.append(sb)
                self._cond.notify_all()
        if sb is not None and self._closed:
            await asyncio.to_thread(sb.close)

    async def acquire(self) -> DockerSandbox:
        """A fresh, started sandbox: from the warm set if one is ready, else created now."""
        async with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("SandboxPool is closed")
                if self._warm:
                    sb = self._warm.pop()
                    if sb._session is not None and sb._session.alive:
                        self._in_use.add(sb)
                        self._refill()
                        return sb
                    # died while waiting (killed from outside): never hand it out
                    self._live -= 1
                    await asyncio.to_thread(sb.close)
                    continue
                if self._live < self.max_containers and self._refilling == 0:
                    self._live += 1
                    break
                await self._cond.wait()
        try:
            sb = await self._create()
        except BaseException:
            async with self._cond:
                self._live -= 1
                self._cond.notify_all()
            raise
        async with self._cond:
            self._in_use.add(sb)
            self._refill()
        return sb

    async def release(self, sb: DockerSandbox) -> None:
        """Return a sandbox: it is removed (never reused) and the warm set is topped up."""
        if sb not in self._in_use:
            raise ValueError(f"{sb!r} was not acquired from this pool")
        self._in_use.discard(sb)
        try:
            await asyncio.to_thread(sb.close)
        finally:
            async with self._cond:
                self._live -= 1
                self._refill()
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[DockerSandbox]:
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await self.release(sb)

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        doomed = self._warm + list(self._in_use)
        self._warm, self._in_use = [], set()
        await asyncio.gather(*(asyncio.to_thread(sb.close) for sb in doomed), return_exceptions=True)
        self._live = 0
