"""Warm pools of sandboxes: containers created ahead of the episodes that will use them.

- `SandboxPool(spec)`: one spec (one image). `acquire()` hands out a sandbox that is already
  created, started and has its shell ready, so an episode does not wait for a container (~300 ms
  idle, seconds under load); the pool refills itself in the background.
- `SandboxPools()`: pools for any number of specs under one container budget, for one run of
  episodes after another (training steps): the containers made ahead follow what the runs will
  acquire next, and the pools can outlive the event loop of any one run (`with`).
- A sandbox is never reused: `release()` removes it, and the next episode gets a fresh one.
- At most `max_containers` exist at once (warm + in use + being created + being removed), and at
  most `max_starts` are being created at once, so a burst of episodes never overloads the Docker
  daemon.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from swerl.sandbox import lifecycle
from swerl.sandbox.docker_sandbox import DockerSandbox
from swerl.structs import SandboxSpec

T = TypeVar("T")


class _Budget:
    """What the pools sharing it stay under together: the container count and the creation slots.
    Its asyncio objects belong to the event loop the pools run in."""

    def __init__(self, limit: int, max_starts: int) -> None:
        self.limit = limit
        self.live = 0  # containers that exist, are being created or are being removed, over all the pools
        self.wanting = 0  # acquirers waiting for room: warm refills give way to them
        self.removing = 0  # idle containers being removed to make room for those acquirers
        self.cond = asyncio.Condition()
        self.starts = asyncio.Semaphore(max_starts)
        self.pools: list[SandboxPool] = []

    def room(self, *, refill: bool) -> bool:
        return self.live + (self.wanting if refill else 0) < self.limit

    def refill_all(self) -> None:
        for pool in self.pools:
            pool._refill()

    def evict(self, needy: SandboxPool) -> None:
        """Start removing an idle warm container of another pool to make room for an acquirer of
        `needy`; the pool furthest above its warm target gives first."""
        idle = [p for p in self.pools if p is not needy and p._warm and not p._closed]
        if idle:
            victim = max(idle, key=lambda p: len(p._warm) - p.warm_target)
            self.removing += 1
            victim._spawn(victim._remove(victim._warm.pop(0), evicted=True))


def _check_bounds(warm: int, max_containers: int, max_starts: int) -> None:
    if warm < 0 or max_containers < 1 or max_starts < 1:
        raise ValueError(f"need warm >= 0, max_containers >= 1, max_starts >= 1; got {warm}, "
                         f"{max_containers}, {max_starts}")
    if warm > max_containers:
        raise ValueError(f"warm ({warm}) cannot exceed max_containers ({max_containers})")


class SandboxPool:
    """Sandboxes of one spec: `warm_target` kept started ahead, handed out by `acquire()`, removed by
    `release()`. Lives in the event loop that first uses it."""

    def __init__(self, spec: SandboxSpec, *, warm: int = 2, max_containers: int = 16, max_starts: int = 4,
                 run_id: str | None = None, client: Any = None, ttl_s: float | None = None,
                 _budget: _Budget | None = None) -> None:
        _check_bounds(warm, max_containers, max_starts)
        self.spec = spec
        self.ttl_s = ttl_s
        self.warm_target = warm
        self.max_containers = max_containers
        self.run_id = run_id or lifecycle.default_run_id()
        self._client = client
        self._budget = _budget or _Budget(max_containers, max_starts)  # shared with other pools, or its own
        self._budget.pools.append(self)
        self._cond = self._budget.cond
        self._warm: list[DockerSandbox] = []
        self._in_use: set[DockerSandbox] = set()
        self._live = 0  # this pool's containers that exist, are being created or removed
        self._refilling = 0
        self._waiters = 0  # acquirers with no sandbox yet
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

    # ---- bookkeeping (callers hold the condition lock) ----------------------------------------------

    def _reserve(self) -> None:
        self._live += 1
        self._budget.live += 1

    def _unreserve(self) -> None:
        self._live -= 1
        self._budget.live -= 1

    def _room(self, *, refill: bool = False) -> bool:
        return self._live < self.max_containers and self._budget.room(refill=refill)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refill(self) -> None:
        """Start background creations up to the warm target, in the room acquirers leave."""
        while (not self._closed and len(self._warm) + self._refilling < self.warm_target
               and self._room(refill=True)):
            self._reserve()
            self._refilling += 1
            self._spawn(self._refill_one())

    # ---- containers --------------------------------------------------------------------------------

    async def _create(self) -> DockerSandbox:
        sb = DockerSandbox(self.spec, run_id=self.run_id, client=self._client,
                           labels=lifecycle.expiry_labels(self.ttl_s))
        async with self._budget.starts:
            try:
                await asyncio.to_thread(sb.start)
            except BaseException:
                await asyncio.to_thread(sb.close)
                raise
        return sb

    async def _remove(self, sb: DockerSandbox, *, evicted: bool = False) -> None:
        """Remove a container of this pool; its room counts as taken until it is gone."""
        try:
            await asyncio.to_thread(sb.close)
        finally:
            async with self._cond:
                self._unreserve()
                self._budget.removing -= evicted
                self._cond.notify_all()
                self._budget.refill_all()

    async def _refill_one(self) -> None:
        sb = None
        try:
            sb = await self._create()
        except Exception:
            pass  # an acquirer that needed it makes its own and reports what went wrong
        finally:
            async with self._cond:
                self._refilling -= 1
                if sb is not None and not self._closed:
                    self._warm.append(sb)
                    sb = None
                elif sb is None:
                    self._unreserve()
                self._cond.notify_all()
        if sb is not None:  # the pool was closed meanwhile
            await self._remove(sb)

    async def acquire(self) -> DockerSandbox:
        """A fresh, started sandbox: from the warm set if one is ready, else created now."""
        budget = self._budget
        async with self._cond:
            self._waiters += 1
            wanting = False
            try:
                while True:
                    if self._closed:
                        raise RuntimeError("SandboxPool is closed")
                    if self._warm:
                        sb = self._warm.pop(0)
                        if sb._session is not None and sb._session.alive:
                            self._in_use.add(sb)
                            self._refill()
                            return sb
                        # died while waiting (killed from outside): never hand it out
                        self._spawn(self._remove(sb))
                        continue
                    if self._refilling >= self._waiters:
                        await self._cond.wait()  # a sandbox under way will be this acquirer's
                        continue
                    if self._room():
                        self._reserve()
                        break
                    if not wanting:
                        wanting = True
                        budget.wanting += 1
                    if self._live < self.max_containers and budget.removing < budget.wanting:
                        budget.evict(self)  # the shared budget is full: an idle container elsewhere goes
                    await self._cond.wait()
            finally:
                self._waiters -= 1
                budget.wanting -= wanting
        try:
            sb = await self._create()
        except BaseException:
            async with self._cond:
                self._unreserve()
                self._cond.notify_all()
                budget.refill_all()
            raise
        handed = False
        try:
            async with self._cond:
                if not self._closed:
                    self._in_use.add(sb)
                    self._refill()
                    handed = True
        finally:
            if not handed:  # closed (or cancelled) while it was being created: it goes at once
                await self._remove(sb)
        if not handed:
            raise RuntimeError("SandboxPool is closed")
        return sb

    async def release(self, sb: DockerSandbox) -> None:
        """Return a sandbox: it is removed (never reused) and the warm set is topped up."""
        if sb not in self._in_use:
            raise ValueError(f"{sb!r} was not acquired from this pool")
        self._in_use.discard(sb)
        await self._remove(sb)

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[DockerSandbox]:
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await self.release(sb)

    async def close(self) -> None:
        """Remove every container of the pool, warm and in use; later acquires raise."""
        async with self._cond:
            self._closed = True
            self._cond.notify_all()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        doomed = self._warm + list(self._in_use)
        self._warm, self._in_use = [], set()
        await asyncio.gather(*(asyncio.to_thread(sb.close) for sb in doomed), return_exceptions=True)
        async with self._cond:
            for _ in doomed:
                self._unreserve()
            if self in self._budget.pools:
                self._budget.pools.remove(self)
            self._cond.notify_all()
            self._budget.refill_all()


class SandboxPools:
    """Pools for any number of sandbox specs (one per image) under one budget of `max_containers`,
    for one run of episodes after another.

    What is made ahead follows the runs. `begin(specs)` announces a run: the spec of each sandbox it
    will acquire, in the order it will acquire them. The pools of specs it does not name are closed;
    the sandboxes of the next `warm` acquisitions still to come are kept started (so at most `warm`
    wait idle, in total and so per image). `end()` closes the run: up to `warm` sandboxes are then
    made for the specs it used most, among those that recur (that the run before it used too; after
    the first run, all of them), for a next run of the same images to find ready: a text game's one
    image gets them, SWE tasks drawn anew each step mostly do not. A sandbox is never reused;
    `acquire(spec)` takes a warm one or creates one, `release(sb)` removes it.

    Lifecycle: `async with SandboxPools(...)` runs the pools in the current event loop (for one
    `asyncio.run`); `with SandboxPools(...)` runs them on an event loop of their own in a daemon
    thread, so they outlive the event loops of the caller (a training loop's `asyncio.run` per step)
    and go on making sandboxes while the caller does other work; their methods may then be awaited
    from any event loop. Leaving either removes every container the pools made; lifecycle's signal
    and exit handlers remove them too if the process is stopped.
    """

    def __init__(self, *, warm: int = 2, max_containers: int = 16, max_starts: int = 4,
                 run_id: str | None = None, client: Any = None, ttl_s: float | None = None) -> None:
        """`client`: the Docker daemon (default: this machine's); `ttl_s`: each container is labelled to
        expire that many seconds after it is made (`lifecycle.reap` removes expired ones), None: never."""
        _check_bounds(warm, max_containers, max_starts)
        self.ttl_s = ttl_s
        self.warm_target = warm
        self.max_containers = max_containers
        self.max_starts = max_starts
        self.run_id = run_id or lifecycle.default_run_id()
        self._client = client
        self._budget: _Budget | None = None
        self._pools: dict[SandboxSpec, SandboxPool] = {}
        self._owner: dict[DockerSandbox, SandboxPool] = {}
        self._upcoming: list[SandboxSpec] = []  # the specs of the acquisitions to come, in order
        self._ran: Counter[SandboxSpec] = Counter()  # acquisitions the current run announced, per spec
        self._ran_before: set[SandboxSpec] | None = None  # the specs of the run before it (None: no such run)
        self._retiring: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        lifecycle.install_handlers()

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def _open(self) -> None:
        self._budget = _Budget(self.max_containers, self.max_starts)
        self._loop = asyncio.get_running_loop()

    async def _connect(self) -> None:
        """The Docker client, made on first need: pools that no run asks a sandbox of never touch Docker."""
        if self._client is None:
            self._client = await asyncio.to_thread(lifecycle.docker_client)

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="swerl-sandbox-pools", daemon=True)
        thread.start()
        self._thread = thread
        try:
            asyncio.run_coroutine_threadsafe(self._open(), loop).result()
        except BaseException:
            self._loop = loop
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """`with` mode: remove every container, then stop the pools' event loop and thread. Call it
        from outside that loop (the `with` block does)."""
        if self._thread is None:
            return
        loop, thread = self._loop, self._thread
        assert loop is not None
        try:
            if self._budget is not None:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
            asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            self._thread = None

    async def aclose(self) -> None:
        """Remove every container the pools made; later acquires raise."""
        if self._thread is not None:
            await asyncio.to_thread(self.close)
        elif self._budget is not None:
            await self._shutdown()

    async def _shutdown(self) -> None:
        assert self._budget is not None
        async with self._budget.cond:
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
            self._upcoming = []
        await asyncio.gather(*(p.close() for p in pools), *self._retiring, return_exceptions=True)

    # ---- calls from any event loop -----------------------------------------------------------------

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` in the pools' event loop and wait for it from the caller's."""
        loop = self._loop
        if loop is None or self._closed:
            coro.close()
            raise RuntimeError("SandboxPools is not open (use it in `with` or `async with`), or closed")
        if loop is asyncio.get_running_loop():
            return await coro
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(self._release_unclaimed)
            raise

    def _release_unclaimed(self, fut: concurrent.futures.Future[Any]) -> None:
        """An acquire whose caller was cancelled: the sandbox it got goes back (is removed)."""
        if not fut.cancelled() and fut.exception() is None and isinstance(fut.result(), DockerSandbox):
            assert self._loop is not None
            asyncio.run_coroutine_threadsafe(self._release(fut.result()), self._loop)

    @property
    def live(self) -> int:
        """Containers that exist, are being created or are being removed, over every pool."""
        return self._budget.live if self._budget is not None else 0

    @property
    def warm(self) -> int:
        """Sandboxes started and waiting to be acquired, over every pool."""
        return sum(len(p._warm) for p in tuple(self._pools.values()))

    async def begin(self, specs: Sequence[SandboxSpec]) -> None:
        """A run is starting: `specs` are the sandboxes it will acquire, in order (one per episode)."""
        await self._call(self._begin(list(specs)))

    async def end(self) -> None:
        """The run is over: sandboxes are made ahead for the next run (see the class doc)."""
        await self._call(self._end())

    async def acquire(self, spec: SandboxSpec) -> DockerSandbox:
        """A fresh, started sandbox of `spec` (warm if one was made ahead)."""
        return await self._call(self._acquire(spec))

    async def release(self, sb: DockerSandbox) -> None:
        """Remove an acquired sandbox (never reused); what is made ahead is topped up."""
        await self._call(self._release(sb))

    # ---- in the pools' event loop ------------------------------------------------------------------

    def _pool(self, spec: SandboxSpec) -> SandboxPool:
        if spec not in self._pools:
            self._pools[spec] = SandboxPool(spec, warm=0, max_containers=self.max_containers,
                                            run_id=self.run_id, client=self._client, ttl_s=self.ttl_s,
                                            _budget=self._budget)
        return self._pools[spec]

    def _retarget(self) -> None:
        """Warm targets: the next `warm` acquisitions to come, counted per spec."""
        assert self._budget is not None
        ahead = Counter(self._upcoming[:self.warm_target])
        for spec, pool in self._pools.items():
            pool.warm_target = ahead.get(spec, 0)
        self._budget.refill_all()

    async def _begin(self, specs: list[SandboxSpec]) -> None:
        assert self._budget is not None
        if specs:
            await self._connect()
        async with self._budget.cond:
            needed = set(specs)
            for spec in [s for s in self._pools if s not in needed]:  # images no longer needed
                task = asyncio.get_running_loop().create_task(self._pools.pop(spec).close())
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            for spec in dict.fromkeys(specs):
                self._pool(spec)
            self._upcoming = specs
            self._ran_before = set(self._ran) if self._ran else None
            self._ran = Counter(specs)
            self._retarget()

    async def _end(self) -> None:
        assert self._budget is not None
        async with self._budget.cond:
            ahead: list[SandboxSpec] = []
            for spec, n in self._ran.most_common():
                if self._ran_before is None or spec in self._ran_before:
                    ahead += [spec] * min(n, self.warm_target - len(ahead))
            self._upcoming = ahead
            self._retarget()

    async def _acquire(self, spec: SandboxSpec) -> DockerSandbox:
        assert self._budget is not None
        await self._connect()
        async with self._budget.cond:
            if self._closed:
                raise RuntimeError("SandboxPools is closed")
            pool = self._pool(spec)  # a spec `begin` did not name gets its pool now
            with contextlib.suppress(ValueError):
                self._upcoming.remove(spec)
            self._retarget()
        sb = await pool.acquire()
        self._owner[sb] = pool
        return sb

    async def _release(self, sb: DockerSandbox) -> None:
        pool = self._owner.pop(sb, None)
        if pool is None:
            raise ValueError(f"{sb!r} was not acquired from these pools")
        await pool.release(sb)
