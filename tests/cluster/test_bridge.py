"""The engine bridge without Ray: the actor's class called in process (`.remote()` made a plain coroutine),
the driver's `serve` loop answering from an engine. Every request is answered exactly once, with its own
prompt's answer, under many at once and a long poll much shorter than the requests' spacing; an engine
error reaches the episode that asked."""

from __future__ import annotations

import asyncio
import random

import pytest

from swerl.cluster.bridge import BridgeEngine, EngineBridge, serve
from swerl.structs import Generation, SamplingParams


class InProcess:
    """`actor.method.remote(*args)` → an awaitable of the method's result that, like a Ray ref, does not
    cancel the call when the awaiting caller is cancelled (the call runs on in the actor)."""

    def __init__(self, obj: object) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> object:
        method = getattr(self._obj, name)

        class _M:
            @staticmethod
            def remote(*args: object, **kwargs: object) -> object:
                out = method(*args, **kwargs)
                if asyncio.iscoroutine(out):
                    return asyncio.shield(asyncio.ensure_future(out))
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(out)
                return fut

        return _M()


class Echo:
    """Answers each prompt with its own ids reversed, after a random pause; prompt [13] is an error."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.calls += 1
        await asyncio.sleep(random.random() * 0.01)
        if prompt_ids == [13]:
            raise RuntimeError("engine says no")
        return Generation(token_ids=tuple(reversed(prompt_ids)), logprobs=(0.0,) * len(prompt_ids),
                          finish_reason="stop")


def test_every_request_gets_its_own_answer_once_and_errors_reach_the_asker():
    random.seed(0)

    async def main() -> None:
        bridge = EngineBridge()
        handle = InProcess(bridge)
        engine = Echo()
        server = asyncio.create_task(serve(handle, engine, concurrency=8, session=1))
        client = BridgeEngine(handle)

        async def ask(i: int) -> tuple[int, ...]:
            await asyncio.sleep(random.random() * 0.05)  # arrivals spread over many empty long polls
            gen = await client.generate([i, i + 1, i + 2], SamplingParams())
            return gen.token_ids

        # take's long poll (1 ms here) times out over and over while requests keep arriving
        real_take = bridge.take
        bridge.take = lambda session, wait_s=1.0, max_requests=512: real_take(session, 0.001, max_requests)  # type: ignore[method-assign]
        got = await asyncio.wait_for(asyncio.gather(*(ask(i) for i in range(300))), 30)
        assert got == [(i + 2, i + 1, i) for i in range(300)]
        assert engine.calls == 300 and bridge.pending() == 0
        with pytest.raises(RuntimeError, match="engine says no"):
            await client.generate([13], SamplingParams())
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)

    asyncio.run(main())


def test_a_cancelled_serve_loop_does_not_carry_off_the_next_runs_request():
    """A run's serve loop is cancelled at its end while its long poll still waits in the actor (Ray does
    not cancel an actor call when its caller stops waiting); closing its session makes that poll give up,
    so the next run's first request reaches the next run's loop."""
    async def main() -> None:
        bridge = EngineBridge()
        handle = InProcess(bridge)
        engine = Echo()
        first = asyncio.create_task(serve(handle, engine, concurrency=2, session=1))
        await asyncio.sleep(0.05)  # its take is waiting (1 s long poll)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await handle.close.remote(1)  # what Fleet.end does after cancelling the loop
        # the next run's first request arrives before its serve loop polls
        asked = asyncio.create_task(BridgeEngine(handle).generate([5, 6], SamplingParams()))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(serve(handle, engine, concurrency=2, session=2))
        gen = await asyncio.wait_for(asked, 5)
        assert gen.token_ids == (6, 5)
        assert await handle.take.remote(1, 0.01) == []  # a closed session never takes again
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)

    asyncio.run(main())
