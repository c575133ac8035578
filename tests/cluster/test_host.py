"""A sandbox host's daemon probe (what its heartbeats ask) on the real Docker daemon, without Ray: it
answers while every worker thread of the host's event loop is held by a tool call."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from swerl.cluster.host import SandboxHost

pytestmark = pytest.mark.docker


def test_the_heartbeat_probe_answers_while_the_loops_threads_are_all_held(docker_client, base_image):
    host = SandboxHost("a", "", capacity=1, run_id="pytest-host-probe", warm=0, ttl_s=60.0, bridge=None)

    async def go() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        release = threading.Event()
        held = asyncio.ensure_future(asyncio.to_thread(release.wait, 60))  # a tool call holds the one thread
        await asyncio.sleep(0.1)
        try:
            assert await asyncio.wait_for(host._daemon_ok(), 10) is True
            # pings that arrive while one is out wait for its answer (one request, not two)
            both = asyncio.gather(host._probe(images=True), host._probe(images=True))
            a, b = await asyncio.wait_for(both, 10)
            assert a is b and base_image in {t for im in a for t in im.get("RepoTags") or ()}
            assert not held.done()
        finally:
            release.set()
            await held

    asyncio.run(go())
