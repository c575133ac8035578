"""Rollouts overlapped with learning, with bounded staleness (`async.max_staleness`) and optional partial
rollouts (`async.partial_rollouts`): the machinery `swerl.train` uses when `max_staleness >= 1`.

Versions. A policy version is the number of learner steps in the weights: the engine starts at the
run's first step (0, or the step resumed from) and a weight update after training step s makes it s.
Every generate call is tagged with the version the engine held when it started
(`Generation.weight_version`, then `Turn.weight_version` / `Trajectory.turn_versions`). Training step s
(1-based) runs on weights of version s − 1, so an episode's staleness there is s − 1 − its oldest turn's
version; 0 is on-policy (the synchronous loop), and nothing staler than `max_staleness` is trained on.

The producer (`AheadRollouts`) runs on its own event loop in a background thread (`BackgroundLoop`),
so episodes go on while the main thread trains; every engine call of the run goes through that loop
(the engine's client and batcher live on one loop). It starts whole rollout groups one at a time and
queues them as they finish, at most `max_staleness` steps ahead: a group meant for step s starts only
once the weights are of version s − 1 − k or newer, so a group that finishes in the order it started
is never too stale; one that finishes late (a long-tail episode) may be, and is then dropped, counted
(`async/dropped_stale`) and replaced. A step takes the first groups to finish, so one slow episode no
longer holds up a whole step.

Weight updates (`AheadRollouts.weight_update`, around the loop's own sync):
- without partial rollouts, no episode spans two versions: no new group starts, the running ones finish
  on the old weights, then the weights change;
- with partial rollouts, generation pauses and episodes continue on the new weights afterwards, each
  turn keeping its own version. In process (hf) new calls wait and the ones in flight (one batch)
  finish; an SGLang server is paused with `/pause_generation` (retract: its running requests resume on
  the new weights after `/continue_generation`; a turn that straddles the update is tagged with the
  version it started on, the older one); a vLLM server likewise with `/pause?mode=keep&clear_cache=true`
  and `/resume` (vllm 0.32 `entrypoints/rl/online/api_router.py` l. 31-91, dev mode, which swerl's
  launched servers have: running requests are preempted with their tokens and recomputed on the new
  weights after the resume; `VLLMEngine.pause_generation`).

The learner's off-policy correction (`algo.recompute_old_logp` with `algo.rollout_is`,
`swerl.algo.offpolicy`) compares the engine's sampling log-probs with the learner's: it corrects stale
tokens the same way it corrects engine mismatch. DAPO's re-sampling rounds do not apply here (the
learner's DAPO filter still drops groups without signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from swerl.structs import EpisodeResult, Generation, SamplingParams, Trajectory

T = TypeVar("T")

PAUSABLE_ENGINES = ("hf", "sglang", "vllm")
"""Engines whose generation can pause at a weight update (`async.partial_rollouts`): hf in process,
SGLang through /pause_generation and /continue_generation, vLLM through /pause?mode=keep and /resume."""


@dataclass(frozen=True)
class AsyncConfig:
    """Rollouts overlapped with learning (config key `async`; `swerl.asyncrl`)."""

    max_staleness: int = 0
    """Steps a rollout may lag the policy it is trained on: 0 is the synchronous loop (rollout → learn →
    sync); k >= 1 runs rollouts for up to k later steps while a step trains, and drops (and counts)
    episodes staler than k."""
    partial_rollouts: bool = False
    """At a weight update, pause generation and continue unfinished episodes on the new weights (their
    turns keep their own versions) instead of letting them finish on the old ones first. Needs
    max_staleness >= 1 and an engine that can pause: hf, sglang or vllm."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"async.max_staleness must be >= 0 (0: synchronous), got {self.max_staleness}")
        if self.partial_rollouts and self.max_staleness == 0:
            raise ValueError("async.partial_rollouts needs async.max_staleness >= 1 (the synchronous loop "
                             "never updates weights while episodes run)")

    @property
    def enabled(self) -> bool:
        return self.max_staleness > 0


def check_engine(cfg: AsyncConfig, engine: str) -> None:
    """Refuse partial rollouts on an engine that cannot pause (before the run starts)."""
    if cfg.partial_rollouts and engine not in PAUSABLE_ENGINES:
        raise ValueError(f"async.partial_rollouts needs an engine that can pause generation "
                         f"({', '.join(PAUSABLE_ENGINES)}); rollout.engine {engine} cannot in swerl: set "
                         "async.partial_rollouts=false")


# ---- the loop --------------------------------------------------------------------------------------


class BackgroundLoop:
    """An asyncio event loop in a thread of its own, used like `asyncio.Runner`: `run(coro)` runs a
    coroutine on it and blocks until it is done, while tasks started there keep running between calls
    (that is the point: rollouts go on while the calling thread trains). Leaving the `with` cancels
    every task still there and stops the thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> BackgroundLoop:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swerl-rollouts", daemon=True)
        self._thread.start()
        return self

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "BackgroundLoop.run outside its with block"
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt in the caller: the coroutine must not run on alone
            raise

    def __exit__(self, *exc: object) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_asyncgens()
            await loop.shutdown_default_executor()

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=60)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=60)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None


def event_loop(cfg: AsyncConfig) -> asyncio.Runner | BackgroundLoop:
    """The run's event loop: the caller's own (`asyncio.Runner`, the synchronous loop exactly as it was)
    or, with max_staleness >= 1, one in a background thread."""
    return BackgroundLoop() if cfg.enabled else asyncio.Runner()


# ---- the producer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One finished rollout group, as the game or the runner returned it."""

    trajectories: tuple[Trajectory, ...]
    """The members to train on (empty: too few usable members, the group is left out)."""
    results: tuple[EpisodeResult, ...] = ()
    """Every episode's runner result (task envs; empty for games played on the engine)."""


@dataclass(frozen=True)
class AheadBatch:
    """One step's rollouts from the producer: what the learner trains on and the `async/` metrics."""

    trajectories: tuple[Trajectory, ...]
    groups: tuple[int, ...]
    """Rollout-group label of each trajectory."""
    results: tuple[EpisodeResult, ...]
    metrics: dict[str, float]


PlayGroup = Callable[[Any, int], Awaitable[Group]]
"""Plays one rollout group on an engine; the int is the step it is meant for (it tags rollouts.jsonl)."""


class _VersionedEngine:
    """The engine as the producer's episodes see it: calls wait while generation is paused, and each
    generation is tagged with the version the engine held when the call started."""

    def __init__(self, engine: Any, version: int) -> None:
        self.engine = engine
        self.version = version
        self.open = asyncio.Event()
        self.open.set()
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def __getattr__(self, name: str) -> Any:  # pad_token_id, generator, ...: the engine's own
        return getattr(self.engine, name)

    async def _call(self, call: Callable[[], Awaitable[T]]) -> tuple[T, int]:
        await self.open.wait()
        version = self.version
        self.in_flight += 1
        self.idle.clear()
        try:
            return await call(), version
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        gen, v = await self._call(lambda: self.engine.generate(prompt_ids, params))
        return dataclasses.replace(gen, weight_version=v)

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams,
                         n: int) -> tuple[Generation, ...]:
        gens, v = await self._call(lambda: self.engine.generate_n(prompt_ids, params, n))
        return tuple(dataclasses.replace(g, weight_version=v) for g in gens)


def staleness(trajectory: Trajectory, trained_version: int) -> int:
    """How many versions the oldest turn of `trajectory` lags the weights it is trained on (0 when its
    versions were not recorded)."""
    return trained_version - min(trajectory.turn_versions) if trajectory.turn_versions else 0


class AheadRollouts:
    """Rollout groups produced ahead of the learner on `loop` (see the module docstring). Use in a
    `with` block: entering starts the producer, leaving cancels every episode still running."""

    def __init__(self, loop: BackgroundLoop, engine: Any, play: PlayGroup, cfg: AsyncConfig, *,
                 tasks_per_step: int, version: int, max_groups: int | None = None) -> None:
        """`version`: the policy version the engine holds now (the step the run starts at);
        `max_groups`: groups running at once (None: as many as the staleness bound lets start)."""
        self.loop, self.play, self.cfg = loop, play, cfg
        self.tasks_per_step = tasks_per_step
        self.max_groups = max_groups
        self.raw_engine = engine
        self._start_version = version
        self.engine: _VersionedEngine | None = None
        self._cond: asyncio.Condition | None = None
        self._done: deque[Group] = deque()
        self._credited = version * tasks_per_step  # groups started for steps (dropped ones handed back)
        self._running = 0
        self._hold_starts = False
        self._server_paused = False
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._producer: asyncio.Task[None] | None = None
        self._dropped = 0  # stale episodes dropped since the last batch
        self._dropped_groups = 0

    # ---- lifetime (called from the training thread) ----------------------------------------------

    def __enter__(self) -> AheadRollouts:
        self.loop.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.run(self._stop())

    async def _start(self) -> None:
        self.engine = _VersionedEngine(self.raw_engine, self._start_version)
        self._cond = asyncio.Condition()
        self._producer = asyncio.create_task(self._produce(), name="swerl-ahead-producer")

    async def _stop(self) -> None:
        tasks = [t for t in (self._producer, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server_paused:  # leave a server as it was found, even after a failed update
            with contextlib.suppress(Exception):
                await self.raw_engine.continue_generation()

    # ---- what the training thread calls ----------------------------------------------------------

    def batch(self, step: int) -> AheadBatch:
        """The rollouts for training step `step` (1-based; the weights are then of version step − 1)."""
        return self.loop.run(self._take(step))

    @contextlib.contextmanager
    def weight_update(self, step: int) -> Iterator[None]:
        """Around the weight sync after training step `step`: pause (see the module docstring), let the
        body update the engine, then resume on version `step`."""
        self.loop.run(self._pause())
        try:
            yield
        finally:
            self.loop.run(self._resume(step))

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No producer generation inside (evaluation gets the engine, and its sampling stream, alone):
        new calls wait, the ones in flight finish first."""
        self.loop.run(self._hold_generation())
        try:
            yield
        finally:
            self.loop.run(self._release_generation())

    # ---- on the loop -----------------------------------------------------------------------------

    async def _changed(self) -> None:
        assert self._cond is not None
        async with self._cond:
            self._cond.notify_all()

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        assert self._cond is not None
        async with self._cond:
            await self._cond.wait_for(predicate)

    def _may_start(self) -> bool:
        assert self.engine is not None
        ahead = (self.engine.version + 1 + self.cfg.max_staleness) * self.tasks_per_step
        return (not self._hold_starts and self._error is None and self._credited < ahead
                and (self.max_groups is None or self._running < self.max_groups))

    async def _produce(self) -> None:
        while True:
            await self._wait_for(self._may_start)
            self._credited += 1
            self._running += 1
            step = (self._credited - 1) // self.tasks_per_step + 1
            task = asyncio.create_task(self._one(step), name=f"swerl-group-step{step}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, step: int) -> None:
        assert self.engine is not None
        try:
            group = await self.play(self.engine, step)
            self._done.append(group)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the training thread raises it at its next batch
            self._error = e
        finally:
            self._running -= 1
            await self._changed()

    async def _take(self, step: int) -> AheadBatch:
        trained_version = step - 1
        k = self.cfg.max_staleness
        kept: list[Group] = []
        hist: Counter[int] = Counter()
        waiting = len(self._done)
        while len(kept) < self.tasks_per_step:
            await self._wait_for(lambda: bool(self._done) or self._error is not None)
            if self._error is not None:
                raise self._error
            group = self._done.popleft()
            lags = [staleness(t, trained_version) for t in group.trajectories]
            if lags and max(lags) > k:  # a straggler: drop it, and let a fresh group start in its place
                self._dropped += len(group.trajectories)
                self._dropped_groups += 1
                self._credited -= 1
                await self._changed()
                continue
            hist.update(lags)
            kept.append(group)
        trajs = [t for g in kept for t in g.trajectories]
        labels = [i for i, g in enumerate(kept) for _ in g.trajectories]
        n = sum(hist.values())
        metrics: dict[str, float] = {
            "async/dropped_stale": self._dropped, "async/dropped_stale_groups": self._dropped_groups,
            "async/staleness_mean": (sum(s * c for s, c in hist.items()) / n) if n else float("nan"),
            "async/staleness_max": max(hist) if hist else float("nan"),
            **{f"async/staleness_{s}": hist.get(s, 0) for s in range(k + 1)},
            "async/partial_episodes": sum(len(set(t.turn_versions)) > 1 for t in trajs),
            "async/groups_ready": waiting,
        }
        self._dropped = self._dropped_groups = 0
        return AheadBatch(tuple(trajs), tuple(labels), tuple(r for g in kept for r in g.results), metrics)

    async def _hold_generation(self) -> None:
        assert self.engine is not None
        self.engine.open.clear()
        await self.engine.idle.wait()

    async def _release_generation(self) -> None:
        assert self.engine is not None
        self.engine.open.set()
        await self._changed()

    async def _pause(self) -> None:
        assert self.engine is not None
        if not self.cfg.partial_rollouts:
            self._hold_starts = True  # the running groups finish on the weights they started with
            await self._wait_for(lambda: self._running == 0 or self._error is not None)
            return
        pause = getattr(self.raw_engine, "pause_generation", None)
        if pause is not None:  # a server holds its running requests; new calls wait here
            self.engine.open.clear()
            self._server_paused = True  # (set first: workers a failed pause did pause are resumed in _stop)
            await pause()
        else:  # in process: the calls in flight (at most a batch) finish, new ones wait
            await self._hold_generation()

    async def _resume(self, version: int) -> None:
        assert self.engine is not None
        self.engine.version = version
        if self._server_paused:
            self._server_paused = False
            await self.raw_engine.continue_generation()
        self._hold_starts = False
        await self._release_generation()
