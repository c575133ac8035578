"""Generation for episodes on other nodes: the driver's engine, served to the sandbox hosts.

The engine stays where it is today, in the driver (the in-process hf engine with the weights the learner
syncs into it, or the client of the SGLang / vLLM servers with their router, pauses and weight updates),
so nothing about generation or weight sync changes on a cluster. A host's episode calls
`BridgeEngine.generate`; the request waits in the `EngineBridge` actor (on the driver's node) until the
driver's `serve` loop takes it (a long poll: one call returns every request queued meanwhile), runs it
on the engine, and hands the answer back. Three Ray calls per model turn, beside the turn's own
generation time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import Any

from swerl.structs import Generation, SamplingParams


@dataclass(frozen=True)
class GenerateRequest:
    """One model turn an episode on a host asks for."""

    id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class GenerateAnswer:
    """The driver's answer to a request: the generation, or the exception the engine raised."""

    id: int
    generation: Generation | None = None
    error: BaseException | None = None


class EngineBridge:
    """The Ray actor (async, on the driver's node) where hosts' requests wait for the driver."""

    def __init__(self) -> None:
        self._queued: list[GenerateRequest] = []
        self._arrived = asyncio.Event()
        self._waiting: dict[int, asyncio.Future[Generation]] = {}
        self._ids = itertools.count()
        self._closed: set[int] = set()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        req = GenerateRequest(next(self._ids), tuple(prompt_ids), params)
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._waiting[req.id] = fut
        self._queued.append(req)
        self._arrived.set()
        try:
            return await fut
        finally:
            self._waiting.pop(req.id, None)

    async def take(self, session: int, wait_s: float = 1.0, max_requests: int = 512) -> list[GenerateRequest]:
        """For serve loop `session`: the requests queued now, or those that come within `wait_s` (none: an
        empty list); nothing once the session is closed. The session matters because a serve loop that is
        cancelled stops waiting for its `take`, but the call itself goes on in here: without the check,
        it would carry off the next run's first request, whose episode would then wait for good. Waits
        on an event, never on a queue's get: a `wait_for(queue.get())` that times out as an item arrives
        drops the item (CPython < 3.12)."""
        if not self._queued and session not in self._closed:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), wait_s)
        if session in self._closed:
            return []
        out, self._queued = self._queued[:max_requests], self._queued[max_requests:]
        return out

    async def close(self, session: int) -> None:
        """Serve loop `session` is over: its `take` still waiting in here returns empty-handed."""
        self._closed.add(session)
        self._arrived.set()

    async def give(self, answers: list[GenerateAnswer]) -> None:
        for a in answers:
            fut = self._waiting.get(a.id)
            if fut is None or fut.done():
                continue  # its episode gave up waiting (engine timeout on the host)
            if a.error is not None:
                fut.set_exception(a.error)
            else:
                fut.set_result(a.generation)  # type: ignore[arg-type]

    def pending(self) -> int:
        return len(self._waiting)


class BridgeEngine:
    """The Engine a host's episode generates with: each call goes to the driver's engine."""

    def __init__(self, bridge: Any) -> None:
        self.bridge = bridge

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await self.bridge.generate.remote(list(prompt_ids), params)


async def serve(bridge: Any, engine: Any, concurrency: int, session: int) -> None:
    """The driver's side: take the hosts' requests and answer each from `engine` (at most `concurrency`
    at once), until cancelled (then `bridge.close(session)`). Runs on the event loop the engine belongs
    to."""
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()

    async def answer(req: GenerateRequest) -> None:
        async with slots:
            try:
                gen = await engine.generate(list(req.prompt_ids), req.params)
                got = GenerateAnswer(req.id, generation=gen)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # the host's episode sees the engine's own exception
                got = GenerateAnswer(req.id, error=e)
        with contextlib.suppress(Exception):  # the bridge is gone: the fleet is closing
            await bridge.give.remote([got])

    try:
        while True:
            for req in await bridge.take.remote(session):
                task = asyncio.create_task(answer(req))
                running.add(task)
                task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*running, return_exceptions=True)
