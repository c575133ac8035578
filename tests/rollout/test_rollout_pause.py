"""Pausing generation for a weight update (async training's partial rollouts): SGLang's
/pause_generation and /continue_generation against FakeSGLangServer (each rule cites SGLang 0.5.21 /
0.5.23), and the async producer driving them around a weight update on the SGLang engine; the same
producer driving vLLM's /pause?mode=keep and /resume on every worker (stub servers: the call order; the
real CPU server's semantics are tests/rollout/test_rollout_vllm_pause.py)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from fakes.fake_sglang import FakeSGLangServer
from fakes.stub_http import StubServer
from rollout_helpers import post

from swerl.asyncrl import AheadRollouts, AsyncConfig, BackgroundLoop, Group
from swerl.models import make_tiny_qwen
from swerl.rollout import EngineError, SGLangEngine, VLLMEngine
from swerl.rollout.config import SGLangServerConfig, VLLMServerConfig
from swerl.structs import SamplingParams, Trajectory


@pytest.fixture(params=["0.5.21", "0.5.23"])
def fake(request, tiny_model_dir, tok):
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, release=request.param) as server:
        yield server


def attach(url: str) -> SGLangEngine:
    return asyncio.run(SGLangEngine.start(SGLangServerConfig(urls=(url,), retries=4, backoff_s=0.05)))


def test_pause_mode_is_validated_as_sglang_does(fake):
    """`PauseGenerationReqInput.mode` is abort | retract | in_place (io_struct.py 0.5.21 l. 1845, 0.5.23
    l. 1946): another value is a validation error; the double does retract only and says so (501)."""
    status, body = post(fake.url, "/pause_generation", {"mode": "sometimes"})
    assert status == 400 and "retract" in body["message"]
    assert post(fake.url, "/pause_generation", {"mode": "abort"})[0] == 501
    assert fake.paused is None
    ok = {"message": "Generation continued successfully.", "status": "ok"}
    assert post(fake.url, "/continue_generation", {}) == (200, ok)


def test_a_paused_server_holds_requests_and_loads_weights_at_once(fake, tok, tmp_path):
    """While paused, running requests answer only after /continue_generation and new ones wait
    (tokenizer_manager.py 0.5.21 l. 894, 0.5.23 l. 939); /update_weights_from_disk does not wait for the
    running requests (no model-update writer lock when paused, 0.5.21 l. 2175-2181, 0.5.23 l. 2307)."""
    other = make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)
    eng = attach(fake.url)
    params = SamplingParams(max_new_tokens=2)
    fake.gate.clear()  # the first request stays "running"
    with ThreadPoolExecutor(2) as ex:
        running = ex.submit(asyncio.run, eng.generate(tok("hi")["input_ids"], params))
        fake.wait_running(1)
        asyncio.run(eng.pause_generation())
        assert fake.paused == "retract"
        fake.gate.set()
        waiting = ex.submit(asyncio.run, eng.generate(tok("ho")["input_ids"], params))
        t0 = time.monotonic()
        asyncio.run(eng.update_weights(other))  # not held up by the running request
        assert time.monotonic() - t0 < 30 and fake.model_path == str(other)
        time.sleep(0.2)
        assert not running.done() and not waiting.done()
        asyncio.run(eng.continue_generation())
        assert len(running.result(60).token_ids) == 2 and len(waiting.result(60).token_ids) == 2
    calls = [(urlsplit(p).path, b) for m, p, b in fake.requests if m == "POST" and "generation" in p]
    assert calls == [("/pause_generation", {"mode": "retract"}), ("/continue_generation", {})]


def test_partial_rollouts_pause_the_server_around_the_weight_update(fake, tok, tmp_path):
    other = make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)
    eng = attach(fake.url)
    prompt = tok("def f():")["input_ids"]
    turn_versions: list[tuple[int, ...]] = []

    async def play(engine, step):
        versions = []
        for _ in range(2):  # two turns, the second may come after an update
            gen = await engine.generate(prompt, SamplingParams(max_new_tokens=2))
            versions.append(gen.weight_version)
            await asyncio.sleep(0.05)
        turn_versions.append(tuple(versions))
        t = Trajectory(token_ids=(1, 2, 3), loss_mask=(0, 1, 1), span=(0, 1, 1), logprobs=(0.0,) * 3,
                       turn_index=(-1, 0, 1), prompt_len=1, terminated=True, truncated=False, stop_reason="x",
                       reward=0.0, turn_versions=tuple(versions))
        return Group((t, t))

    cfg = AsyncConfig(max_staleness=1, partial_rollouts=True)
    with (BackgroundLoop() as loop,
          AheadRollouts(loop, eng, play, cfg, tasks_per_step=2, version=0) as ahead):
        ahead.batch(1)
        with ahead.weight_update(1):
            assert fake.paused == "retract"  # paused before the update, for its whole length
            loop.run(eng.update_weights(other))
        assert fake.paused is None
        b2 = ahead.batch(2)
        assert b2.metrics["async/staleness_max"] <= 1
        loop.run(eng.close())
    paths = [urlsplit(p).path for m, p, _ in fake.requests if m == "POST" and p != "/generate"]
    assert paths == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    assert {v for vs in turn_versions for v in vs} <= {0, 1}


# ---- vLLM: /pause?mode=keep and /resume on every worker, in the producer's order (stub servers) ------

VLLM_PAUSE = "/pause?mode=keep&clear_cache=true"


def vllm_stub(log: list[tuple[str, str]], name: str, *, pause: int = 200) -> StubServer:
    """A vLLM 0.32-shaped worker (the routes `VLLMEngine` uses, with their answers' shapes: /pause and
    /resume answer `{"status": "paused"}` / `{"status": "resumed"}`, `entrypoints/rl/online/api_router.py`
    l. 57-59, 82-84) that appends (name, path) of every POST to `log`. `pause`: /pause's status (404:
    a server without dev mode, where the route does not exist)."""

    def post(answer, status=200):
        def handle(seen):
            log.append((name, seen.path))
            return status, answer
        return handle

    def completions(seen):
        log.append((name, seen.path))
        return 200, {"choices": [{"index": 0, "token_ids": [5], "finish_reason": "length",
                                  "stop_reason": None,
                                  "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}}]}

    routes = {"/health": lambda s: (200, b""), "/version": lambda s: (200, {"version": "0.32.0"}),
              "/v1/models": lambda s: (200, {"data": [{"id": "policy"}]}), "/v1/completions": completions,
              "/collective_rpc": post({"results": [None]}), "/reset_prefix_cache": post({"success": True}),
              "/resume": post({"status": "resumed"})}
    if pause != 404:
        routes["/pause"] = post({"status": "paused"} if pause == 200 else {"error": "boom"}, pause)
    return StubServer(routes).start()


def test_partial_rollouts_pause_every_vllm_worker_around_the_weight_update(tmp_path):
    """Every worker is paused (keep) before the reload reaches any, and resumed only after every
    worker has reloaded and reset its prefix cache; no generation is sent in between."""
    log: list[tuple[str, str]] = []
    a, b = vllm_stub(log, "a"), vllm_stub(log, "b")
    try:
        eng = asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(a.url, b.url), backoff_s=0.01)))
        versions: list[int] = []

        async def play(engine, step):
            for _ in range(2):
                gen = await engine.generate([1, 2], SamplingParams(max_new_tokens=1))
                versions.append(gen.weight_version)
                await asyncio.sleep(0.02)
            return Group((_traj(), _traj()))

        cfg = AsyncConfig(max_staleness=1, partial_rollouts=True)
        with (BackgroundLoop() as loop,
              AheadRollouts(loop, eng, play, cfg, tasks_per_step=2, version=0) as ahead):
            ahead.batch(1)
            with ahead.weight_update(1):
                assert {(w, p) for w, p in log if p == VLLM_PAUSE} == {("a", VLLM_PAUSE), ("b", VLLM_PAUSE)}
                mark = len(log)
                loop.run(asyncio.sleep(0.1))  # the producer's new calls wait: nothing reaches a server
                assert len(log) == mark
                loop.run(eng.update_weights(tmp_path))
            ahead.batch(2)
            loop.run(eng.close())
        control = [(w, p) for w, p in log if p != "/v1/completions"]
        first = control[:2]
        assert sorted(first) == [("a", VLLM_PAUSE), ("b", VLLM_PAUSE)]
        for w in ("a", "b"):
            assert [p for x, p in control if x == w] == [VLLM_PAUSE, "/collective_rpc", "/reset_prefix_cache",
                                                         "/resume"]
        resumes = [i for i, (_, p) in enumerate(log) if p == "/resume"]
        reloads = [i for i, (_, p) in enumerate(log) if p in ("/collective_rpc", "/reset_prefix_cache")]
        pauses = [i for i, (_, p) in enumerate(log) if p == VLLM_PAUSE]
        assert max(pauses) < min(reloads) and max(reloads) < min(resumes)
        between = [p for _, p in log[max(pauses) + 1:min(resumes)]]
        assert "/v1/completions" not in between
        assert set(versions) <= {0, 1} and eng.weight_version == 1
    finally:
        a.stop()
        b.stop()


def test_a_vllm_worker_that_cannot_pause_fails_the_update_and_the_others_are_resumed(tmp_path):
    """A server without dev mode has no /pause (404): a one-line error naming VLLM_SERVER_DEV_MODE.
    A pause that fails on one worker fails the update, and leaving the producer resumes every worker
    (the ones paused must not stay paused)."""
    log: list[tuple[str, str]] = []
    plain = vllm_stub(log, "plain", pause=404)
    try:
        eng = asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(plain.url,), backoff_s=0.01)))
        with pytest.raises(EngineError, match=r"has no /pause: start it with VLLM_SERVER_DEV_MODE=1"):
            asyncio.run(eng.pause_generation())
        asyncio.run(eng.close())
    finally:
        plain.stop()
    log.clear()
    a, b = vllm_stub(log, "a"), vllm_stub(log, "b", pause=500)
    try:
        eng = asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(a.url, b.url), backoff_s=0.01)))

        async def play(engine, step):
            await engine.generate([1], SamplingParams(max_new_tokens=1))
            return Group((_traj(),))

        cfg = AsyncConfig(max_staleness=1, partial_rollouts=True)
        with (pytest.raises(EngineError, match=r"/pause\?mode=keep: HTTP 500"), BackgroundLoop() as loop,
              AheadRollouts(loop, eng, play, cfg, tasks_per_step=1, version=0) as ahead):
            ahead.batch(1)
            with ahead.weight_update(1):
                raise AssertionError("the update must not run when a worker did not pause")
        assert ("a", "/resume") in log and ("b", "/resume") in log
        assert not any(p == "/collective_rpc" for _, p in log)
        asyncio.run(eng.close())
    finally:
        a.stop()
        b.stop()


def _traj() -> Trajectory:
    return Trajectory(token_ids=(1, 2, 3), loss_mask=(0, 1, 1), span=(0, 1, 1), logprobs=(0.0,) * 3,
                      turn_index=(-1, 0, 1), prompt_len=1, terminated=True, truncated=False, stop_reason="x",
                      reward=0.0, turn_versions=(0,))
