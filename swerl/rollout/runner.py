"""The concurrent episode runner: many episodes at once on one engine and a set of sandbox pools.

- Concurrency is bounded twice: by `max_episodes` (each running episode holds one sandbox; the
  pools cap their containers too) and by `engine_concurrency` (generate calls in flight; an engine
  batches whatever is in flight, so this is its batch-size budget).
- Sandboxes come from `SandboxPools`: the caller's (e.g. the training loop's, kept across steps so
  that what is made ahead survives from one run to the next) or the runner's own. Each run tells
  the pools which sandboxes it will acquire, in order, so the next `warm` episodes to start find
  theirs already running.
- A failed episode (sandbox died, engine timed out or failed, env raised) becomes an
  `EpisodeResult` with `trajectory=None` and the reason; it is excluded from training and never
  raises through the batch. Only a failure of the runner itself (e.g. the results file cannot be
  written) propagates.
- Per-episode stats are measured by wrapping the engine and the env, so they hold for any engine
  and env: time in engine calls (and queueing for an engine slot) vs time in env reset/step
  (the sandbox), and time waiting for a sandbox.
- Results are appended to a JSONL file as they finish (`ResultsWriter`), one `os.write` of a full
  line on an O_APPEND descriptor followed by fsync, so a crash loses nothing that had finished;
  `read_results` skips a torn last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from swerl.agent import Env, run_episode
from swerl.agent.engine import Engine
from swerl.agent.env import EpisodeSpec
from swerl.rollout.engine import EngineError, EngineTimeout, EngineUnavailable
from swerl.sandbox import SandboxError
from swerl.sandbox.pool import SandboxPools
from swerl.structs import (
    EnvStart,
    EpisodeLimits,
    EpisodeResult,
    EpisodeStats,
    Generation,
    ParsedTurn,
    SamplingParams,
    StepResult,
)

# ---- measuring wrappers ----------------------------------------------------------------------------


@dataclass
class _Meter:
    engine_s: float = 0.0
    engine_queue_s: float = 0.0
    engine_calls: int = 0
    env_s: float = 0.0
    generated_tokens: int = 0


class _MeteredEngine:
    """Times one episode's engine calls, queues them on the runner's engine slots, and turns a stuck
    call into `EngineTimeout` (not `TimeoutError`, which run_episode reads as its wall clock)."""

    def __init__(self, engine: Engine, slots: asyncio.Semaphore, meter: _Meter,
                 timeout_s: float | None) -> None:
        self.engine, self.slots, self.meter, self.timeout_s = engine, slots, meter, timeout_s

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        t0 = time.monotonic()
        try:
            async with self.slots:
                self.meter.engine_queue_s += time.monotonic() - t0
                try:
                    gen = await asyncio.wait_for(self.engine.generate(prompt_ids, params), self.timeout_s)
                except TimeoutError as e:
                    raise EngineTimeout(f"engine.generate took longer than {self.timeout_s} s "
                                        f"(prompt of {len(prompt_ids)} tokens)") from e
        finally:
            self.meter.engine_s += time.monotonic() - t0
            self.meter.engine_calls += 1
        self.meter.generated_tokens += len(gen.token_ids)
        return gen


class _MeteredEnv:
    """Times an Env's reset/step (they run in worker threads; a lock-free float add per call is
    enough because one episode's calls never overlap)."""

    def __init__(self, env: Env, meter: _Meter) -> None:
        self.env, self.meter = env, meter
        self.action_format = env.action_format

    def reset(self) -> EnvStart:
        t0 = time.monotonic()
        try:
            return self.env.reset()
        finally:
            self.meter.env_s += time.monotonic() - t0

    def step(self, turn: ParsedTurn) -> StepResult:
        t0 = time.monotonic()
        try:
            return self.env.step(turn)
        finally:
            self.meter.env_s += time.monotonic() - t0


class _EnvFailed(Exception):
    """An exception raised by the env (reset/step) or its factory, tagged so it is reported as `env`."""


class _GuardedEnv(_MeteredEnv):
    def reset(self) -> EnvStart:
        try:
            return super().reset()
        except SandboxError:
            raise
        except Exception as e:
            raise _EnvFailed(f"env.reset: {type(e).__name__}: {e}") from e

    def step(self, turn: ParsedTurn) -> StepResult:
        try:
            return super().step(turn)
        except SandboxError:
            raise
        except Exception as e:
            raise _EnvFailed(f"env.step: {type(e).__name__}: {e}") from e


def classify(exc: BaseException) -> str:
    """The `error_kind` of an episode failure (an exception may name its own: `failure_kind`)."""
    own = getattr(exc, "failure_kind", None) or getattr(exc.__cause__, "failure_kind", None)
    if isinstance(own, str) and own:
        return own
    if isinstance(exc, EngineTimeout):
        return "engine_timeout"
    if isinstance(exc, EngineError):
        return "engine"
    if isinstance(exc, SandboxError):
        return "sandbox"
    if isinstance(exc, _EnvFailed):
        return "env"
    return "harness"


# ---- the results file ------------------------------------------------------------------------------


class ResultsWriter:
    """Appends `EpisodeResult`s to a JSONL file, one durable line per record.

    Each record is written with a single `os.write` of the whole line on an O_APPEND descriptor, then
    fsynced, so a record is either entirely in the file or (after a crash mid-write) a torn last line
    that `read_results` skips. Opening an existing file first cuts such a torn tail, so appending
    after a crash never glues a new record onto a fragment.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._repair_tail()

    def _repair_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            data = f.read()
        if data.endswith(b"\n"):
            return
        os.ftruncate(self._fd, data.rfind(b"\n") + 1)
        os.fsync(self._fd)

    def write(self, result: EpisodeResult) -> None:
        line = (result.to_json() + "\n").encode("utf-8")
        with self._lock:
            written = os.write(self._fd, line)
            # regular files take a whole write unless the disk is full; finish the line rather than
            # leave a fragment the next record would follow
            while written < len(line):
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_results(path: str | os.PathLike[str]) -> list[EpisodeResult]:
    """The records of a results file. A torn last line (a crash mid-write: no final newline) is
    skipped; a bad line anywhere else is corruption and raises."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    del torn  # a partial record: never trusted, even if it happens to parse
    out = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            out.append(EpisodeResult.from_json(raw.decode("utf-8")))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not an EpisodeResult record ({type(e).__name__}: {e})") from e
    return out


# ---- the runner ------------------------------------------------------------------------------------


@dataclass
class RunSummary:
    """Counts over a run, for the progress line and logs (not a cross-module struct)."""

    total: int = 0
    done: int = 0
    running: int = 0
    failed: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class RemotePlace(Protocol):
    """Sandboxes that live elsewhere (a fleet of sandbox hosts): the place runs each episode itself, next
    to its sandbox, and hands back the result. `begin` / `end` bracket a run as `SandboxPools`' do."""

    async def begin(self, specs: Sequence[Any]) -> None: ...

    async def end(self) -> None: ...

    async def run_episode(self, spec: EpisodeSpec, runner: EpisodeRunner) -> EpisodeResult: ...


@dataclass(frozen=True)
class _Threads:
    pool: ThreadPoolExecutor
    size: int


_loop_threads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Threads] = weakref.WeakKeyDictionary()


def ensure_threads(n: int) -> None:
    """Give the running loop's `asyncio.to_thread` at least `n` workers. A running episode holds one for
    as long as its env resets, steps (a tool call: seconds to minutes) or grades, and a loop's own pool has
    min(32, cores + 4): on 2 cores, 8 episodes would take turns in 6 threads, and a host of 64 sandboxes in
    32."""
    loop = asyncio.get_running_loop()
    ours = _loop_threads.get(loop)
    if ours is not None and ours.size >= n:
        return
    size = max(n, min(32, (os.cpu_count() or 1) + 4))
    pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="swerl-episode")
    # the pool it replaces (asyncio's own, made by an earlier to_thread, or ours) finishes what it runs
    # and then lets its threads go: asyncio.run shuts down only the pool the loop has at its end
    replaced = ours.pool if ours is not None else getattr(loop, "_default_executor", None)
    loop.set_default_executor(pool)
    _loop_threads[loop] = _Threads(pool, size)
    if replaced is not None:
        replaced.shutdown(wait=False)


class EpisodeRunner:
    """Runs episode specs concurrently on one engine; see the module docstring."""

    def __init__(self, engine: Engine, tokenizer: Any, *, params: SamplingParams | None = None,
                 limits: EpisodeLimits | None = None, max_episodes: int = 8, engine_concurrency: int = 32,
                 engine_timeout_s: float | None = 600.0, pools: SandboxPools | RemotePlace | None = None,
                 warm: int = 2, max_containers: int = 16, run_id: str | None = None,
                 results_path: str | os.PathLike[str] | None = None, train_step: int | None = None,
                 progress: bool | Callable[[RunSummary], None] = True,
                 on_result: Callable[[EpisodeResult], None] | None = None) -> None:
        """`pools`: the sandbox pools to use (they belong to the caller, who may keep them across runs), or a
        `RemotePlace` (a fleet of sandbox hosts: it runs the episodes there);
        without them the runner makes its own on its first run, with `warm` / `max_containers` / `run_id`
        (in that run's event loop), and `close()` removes them. `results_path`: the JSONL file the
        results are appended to (typically `<run dir>/rollouts.jsonl`); `train_step`: the training step
        every result is tagged with (`EpisodeResult.train_step`). `progress`: a rich progress
        bar (True), none (False), or a callback given the counts whenever an episode starts or ends
        (for a caller that draws its own display). `on_result`: called (in a worker thread) with each result
        as its episode ends, e.g. to save it where a resumed run finds it (evaluation's sample files);
        an exception there is the runner's own failure and propagates."""
        if max_episodes < 1 or engine_concurrency < 1:
            raise ValueError(f"need max_episodes >= 1 and engine_concurrency >= 1, got {max_episodes}, "
                             f"{engine_concurrency}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.params = params or SamplingParams()
        self.limits = limits or EpisodeLimits()
        self.max_episodes = max_episodes
        self.engine_concurrency = engine_concurrency
        self.engine_timeout_s = engine_timeout_s
        self.warm = warm
        self.max_containers = max_containers
        self.run_id = run_id
        self.results_path = Path(results_path) if results_path is not None else None
        self.train_step = train_step
        self.progress = progress
        self.on_result = on_result
        self._pools = pools
        self._own_pools: SandboxPools | None = None

    async def _sandbox_pools(self) -> SandboxPools:
        if self._pools is None:
            self._own_pools = SandboxPools(warm=min(self.warm, self.max_containers),
                                           max_containers=self.max_containers, run_id=self.run_id)
            self._pools = await self._own_pools.__aenter__()
        return self._pools

    async def close(self) -> None:
        """Remove the pools this runner made (pools passed in belong to the caller)."""
        if self._own_pools is not None:
            await self._own_pools.aclose()
            self._pools = self._own_pools = None

    async def __aenter__(self) -> EpisodeRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, specs: Sequence[EpisodeSpec]) -> list[EpisodeResult]:
        """Run every spec; results come back in the order of `specs` (the file holds them in
        finishing order)."""
        needs = [s.sandbox for s in specs if s.sandbox is not None]  # in the order the episodes start
        ensure_threads(self.max_episodes + 4)  # + the results writer, on_result, pool starts
        # a fleet of sandbox hosts (`swerl.cluster.Fleet`) runs each episode on its sandbox's host
        remote: RemotePlace | None = self._pools if isinstance(self._pools, RemotePlace) else None
        pools = remote if remote is not None else (await self._sandbox_pools() if needs else None)
        if pools is not None:
            await pools.begin(needs)
        episode_slots = asyncio.Semaphore(self.max_episodes)
        engine_slots = asyncio.Semaphore(self.engine_concurrency)
        summary = RunSummary(total=len(specs))
        writer = ResultsWriter(self.results_path) if self.results_path is not None else None
        try:
            with self._progress(len(specs)) as advance:
                async def one(spec: EpisodeSpec) -> EpisodeResult:
                    async with episode_slots:
                        summary.running += 1
                        advance(summary)
                        try:
                            result = await (remote.run_episode(spec, self) if remote is not None
                                            else self.run_one(spec, engine_slots, pools))
                        finally:
                            summary.running -= 1
                    if writer is not None:
                        await asyncio.to_thread(writer.write, result)
                    if self.on_result is not None:
                        await asyncio.to_thread(self.on_result, result)
                    summary.done += 1
                    if not result.ok:
                        summary.failed += 1
                        summary.by_kind[result.error_kind] = summary.by_kind.get(result.error_kind, 0) + 1
                    advance(summary)
                    return result

                return list(await asyncio.gather(*(one(s) for s in specs)))
        finally:
            if writer is not None:
                writer.close()
            if pools is not None:
                with contextlib.suppress(RuntimeError):  # the pools were closed under the run
                    await pools.end()

    async def run_one(self, spec: EpisodeSpec, engine_slots: asyncio.Semaphore,
                      pools: SandboxPools | None) -> EpisodeResult:
        """One episode on this runner's engine with a sandbox from `pools`: its result, failed or not (only
        `EngineUnavailable` raises). A fleet's sandbox host runs its episodes through this too."""
        meter = _Meter()
        t0 = time.monotonic()
        acquire_s = 0.0
        sandbox = None
        env: Env | None = None
        trajectory = None
        report: Any = None
        finish_s = 0.0
        error, kind = "", ""
        try:
            if spec.sandbox is not None:
                assert pools is not None
                sandbox = await pools.acquire(spec.sandbox)
                acquire_s = time.monotonic() - t0
            try:
                env = await asyncio.to_thread(spec.make_env, sandbox)
            except SandboxError:
                raise
            except Exception as e:
                raise _EnvFailed(f"make_env: {type(e).__name__}: {e}") from e
            engine = _MeteredEngine(self.engine, engine_slots, meter, self.engine_timeout_s)
            trajectory = await run_episode(_GuardedEnv(env, meter), engine, self.tokenizer,
                                           params=self.params, limits=self.limits)
            if spec.finish is not None:
                t_finish = time.monotonic()
                try:
                    trajectory = await asyncio.to_thread(spec.finish, env, trajectory)
                except SandboxError:
                    raise
                except Exception as e:
                    raise _EnvFailed(f"finish: {type(e).__name__}: {e}") from e
                finish_s = time.monotonic() - t_finish
            if spec.report is not None:
                try:
                    report = await asyncio.to_thread(spec.report, env)
                except Exception as e:
                    raise _EnvFailed(f"report: {type(e).__name__}: {e}") from e
            if spec.latency_s:
                await asyncio.sleep(spec.latency_s)
        except EngineUnavailable:
            raise  # no server is left to generate with: the run stops here, nothing would succeed
        except Exception as e:  # any other episode failure is a result, never a batch failure
            error, kind = f"{type(e).__name__}: {e}", classify(e)
        finally:
            close = getattr(env, "close", None)
            if callable(close):  # finished or failed, the env's own resources go first (e.g. a game server)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(close)
            if sandbox is not None and pools is not None:
                # a sandbox that died can still be released (close is idempotent and tolerant)
                with contextlib.suppress(Exception):
                    await pools.release(sandbox)
        tr = None if error else trajectory  # a finish or report hook that failed fails the episode
        stats = EpisodeStats(
            turns=tr.num_turns if tr else meter.engine_calls, tool_calls=tr.num_tool_calls if tr else 0,
            malformed=tr.num_malformed if tr else 0, prompt_tokens=tr.prompt_len if tr else 0,
            generated_tokens=sum(tr.loss_mask) if tr else meter.generated_tokens,
            total_tokens=len(tr.token_ids) if tr else 0, wall_s=time.monotonic() - t0,
            sandbox_acquire_s=acquire_s, engine_s=meter.engine_s, engine_queue_s=meter.engine_queue_s,
            engine_calls=meter.engine_calls, env_s=meter.env_s, finish_s=finish_s,
        )
        return EpisodeResult(task_id=spec.task_id, group=spec.group, sample=spec.sample, trajectory=tr,
                             error=error, error_kind=kind, stats=stats, train_step=self.train_step,
                             report=report)

    @contextlib.contextmanager
    def _progress(self, total: int) -> Iterator[Callable[[RunSummary], None]]:
        if callable(self.progress):
            yield self.progress
            return
        if not self.progress:
            yield lambda s: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[failed]}"), transient=False) as bar:
            task = bar.add_task("episodes", total=total, failed="")

            def advance(s: RunSummary) -> None:
                note = f"failed {s.failed} " + json.dumps(s.by_kind) if s.failed else ""
                bar.update(task, completed=s.done, failed=note)

            yield advance


async def run_episodes(specs: Sequence[EpisodeSpec], engine: Engine, tokenizer: Any,
                       **kwargs: Any) -> list[EpisodeResult]:
    """One-shot: an `EpisodeRunner` with `kwargs`, run on `specs`; the pools it made (none when
    `pools=` is given: those stay the caller's) are removed afterwards."""
    async with EpisodeRunner(engine, tokenizer, **kwargs) as runner:
        return await runner.run(specs)
