"""Server topology and failures (swerl/rollout/server.py): generations through the router or
round-robin over the workers, weight updates and flushes to every worker, a worker that stops
answering leaving the rotation for good (with one warning) while the request it had is retried once
on another, and EngineUnavailable when none is left; plus API keys and https against the SGLang
double. SGLang workers and routers are FakeSGLangServer (tests/rollout/fakes/fake_sglang.py; a double as the
"router" answers /generate itself, which is all a router does for swerl); vLLM-shaped workers are
StubServer (tests/rollout/fakes/stub_http.py). No test waits on a clock except the timeout rule's own."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor

import pytest
from fakes.fake_sglang import FakeSGLangServer, learner_group
from fakes.stub_http import StubServer, self_signed_cert

from swerl.models import make_tiny_qwen
from swerl.rollout import EngineError, EngineTimeout, EngineUnavailable, SGLangEngine, VLLMEngine
from swerl.rollout.config import SGLangServerConfig, VLLMServerConfig
from swerl.structs import SamplingParams

PARAMS = SamplingParams(max_new_tokens=2)


@pytest.fixture
def fakes(tiny_model_dir, tok):
    """make(n=1, **kw) -> n running FakeSGLangServers (0.5.23), all stopped at the end."""
    made: list[FakeSGLangServer] = []

    def make(n: int = 1, **kw) -> list[FakeSGLangServer]:
        out = [FakeSGLangServer(tiny_model_dir, tokenizer=tok, **kw).__enter__() for _ in range(n)]
        made.extend(out)
        return out

    yield make
    for f in made:
        f.stop()


def attach(*urls: str, **kw) -> SGLangEngine:
    kw.setdefault("retries", 3)
    kw.setdefault("backoff_s", 0.01)
    return asyncio.run(SGLangEngine.start(SGLangServerConfig(urls=urls, **kw)))


def gen(eng, prompt=(1, 2, 3)):
    return asyncio.run(eng.generate(list(prompt), PARAMS))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "swerl.rollout"]


def test_generation_goes_to_the_router_and_weights_and_flushes_to_every_worker(fakes, tok, tmp_path):
    w1, w2, router = fakes(3)
    eng = attach(w1.url, w2.url, router_url=router.url)
    assert router.paths() == ["/health"]  # the router is only asked /health on attach
    assert eng.versions == {w1.url: "0.5.23", w2.url: "0.5.23"}
    before = router.connections
    for _ in range(4):
        assert len(gen(eng).token_ids) == 2
    assert router.paths().count("/generate") == 4 and "/generate" not in w1.paths() + w2.paths()
    assert router.connections - before <= 1  # keep-alive: the four generations share one connection
    asyncio.run(eng.update_weights(make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)))
    asyncio.run(eng.flush_cache())
    for w in (w1, w2):
        assert (w.paths().count("/update_weights_from_disk") == 1 and w.weight_version == "1"
                and w.flushes == 2)
    assert "/update_weights_from_disk" not in router.paths() and router.flushes == 0
    assert asyncio.run(eng.health()) == {w1.url: True, w2.url: True, router.url: True}
    # a worker lost behind a router stops the run: the router could send it requests with old weights
    w2.stop()
    with pytest.raises(EngineUnavailable,
                       match=rf"update_weights_from_disk: worker {w2.url} is gone \(3 attempts.*"
                                                r"the router could still send it requests with the old "
                                                r"weights"):
        asyncio.run(eng.update_weights(tmp_path / "step1"))
    assert eng.weight_version == 1
    router.stop()
    with pytest.raises(EngineUnavailable, match=rf"^the SGLang router at {router.url} is gone"):
        gen(eng)
    asyncio.run(eng.close())


def test_router_url_needs_the_workers():
    with pytest.raises(ValueError, match="router_url needs the workers in urls too"):
        SGLangServerConfig(model_path="/m", router_url="http://r:1")
    with pytest.raises(ValueError, match="router_url http://a:1 is also one of the worker urls"):
        SGLangServerConfig(urls=("http://a:1",), router_url="http://a:1")
    with pytest.raises(ValueError, match="router_url: 'r:1' is not an http"):
        SGLangServerConfig(urls=("http://a:1",), router_url="r:1")


def test_a_killed_worker_leaves_the_rotation_and_its_request_is_retried_once(fakes, tok, tmp_path, caplog):
    a, b = fakes(2)
    eng = attach(a.url, b.url)
    a.gate.clear()  # the first generation (round-robin starts at a) stays running on a
    with ThreadPoolExecutor(1) as ex, caplog.at_level(logging.INFO, logger="swerl.rollout"):
        running = ex.submit(asyncio.run, eng.generate([1, 2, 3], PARAMS))
        a.wait_running(1)
        a.stop()  # killed mid-request: the connection is cut, new ones are refused
        g = running.result(60)
    assert len(g.token_ids) == 2
    assert a.paths().count("/generate") == 1 and b.paths().count("/generate") == 1
    assert eng.live == (b.url,) and list(eng.left) == [a.url]
    assert eng.generations == 1 and eng.failovers == 1  # one call, one result: the retry is not counted twice
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"SGLang worker {a.url} left the rotation for the rest of the run (1 of 2 "
                              "left): /generate: 3 attempts over ")
    for _ in range(3):
        gen(eng)
    asyncio.run(eng.update_weights(make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)))
    assert b.paths().count("/generate") == 4 and b.weight_version == "1" and eng.weight_version == 1
    assert len(warnings_of(caplog)) == 1
    asyncio.run(eng.close())


def test_a_worker_that_left_stays_out_even_when_it_answers_again(fakes, tok, tmp_path):
    a, b = fakes(2)
    eng = attach(a.url, b.url)
    a.drop_next(3)  # a stops answering (3 = every attempt of one request), then answers again
    gen(eng)
    assert eng.live == (b.url,) and eng.failovers == 1
    seen = len(a.requests)
    for _ in range(4):
        gen(eng)
    asyncio.run(eng.update_weights(make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)))
    asyncio.run(eng.flush_cache())
    # never asked again: no stale weights served
    assert len(a.requests) == seen and a.weight_version == "default"
    assert b.weight_version == "1"
    assert asyncio.run(eng.health()) == {a.url: True, b.url: True}  # health still reports every worker
    asyncio.run(eng.close())


def test_a_weight_update_that_loses_a_worker_succeeds_on_the_rest(fakes, tok, tmp_path, caplog):
    a, b = fakes(2)
    eng = attach(a.url, b.url)
    b.stop()
    with caplog.at_level(logging.WARNING, logger="swerl.rollout"):
        asyncio.run(eng.update_weights(make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)))
    assert eng.weight_version == 1 and a.weight_version == "1" and eng.live == (a.url,)
    [warning] = warnings_of(caplog)
    assert f"worker {b.url} left the rotation" in warning and ("update_weights_from_disk: 3 "
                                                               "attempts") in warning
    # an HTTP error of a worker is not a lost worker: the update fails, the worker stays
    with pytest.raises(EngineError, match="could not load weights from /nonexistent"):
        asyncio.run(eng.update_weights("/nonexistent"))
    assert eng.live == (a.url,) and eng.weight_version == 1
    asyncio.run(eng.close())


def test_no_worker_left_is_a_clear_error(fakes):
    a, b = fakes(2)
    eng = attach(a.url, b.url)
    a.stop()
    b.stop()
    with pytest.raises(EngineUnavailable,
                       match=rf"^no SGLang server left: {a.url} \(/generate: 3 attempts .*\); "
                                                rf"{b.url} \(/generate: 3 attempts .*\) — the run cannot go "
                                                r"on"):
        gen(eng)
    assert eng.live == () and eng.failovers == 1 and eng.generations == 0
    with pytest.raises(EngineUnavailable, match=r"^no SGLang server left"):  # at once from now on
        gen(eng)
    with pytest.raises(EngineUnavailable, match=r"^no SGLang server left"):
        asyncio.run(eng.flush_cache())
    asyncio.run(eng.close())


def test_a_worker_whose_requests_keep_timing_out_leaves_the_rotation(fakes, caplog):
    a, b = fakes(2)
    eng = attach(a.url, b.url, retries=2, request_timeout_s=2.0)
    a.gate.clear()  # a takes requests and never answers
    with caplog.at_level(logging.WARNING, logger="swerl.rollout"):
        with pytest.raises(EngineTimeout, match=rf"POST {a.url}/generate: no response within 2 s"):
            gen(eng)  # a: timed out, not retried (the request is running there)
        gen(eng)  # b
        assert eng.live == (a.url, b.url)
        with pytest.raises(EngineTimeout):
            gen(eng)  # a again: the second in a row
        assert eng.live == (b.url,)
        gen(eng)
        gen(eng)
    assert a.paths().count("/generate") == 2 and b.paths().count("/generate") == 3
    [warning] = warnings_of(caplog)
    assert f"worker {a.url} left the rotation" in warning and "its last 2 requests timed out" in warning
    asyncio.run(eng.close())


def test_a_lost_worker_stops_distributed_updates(fakes):
    import torch

    a, b = fakes(2)
    eng = attach(a.url, b.url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ThreadPoolExecutor(1) as ex:
        learner = ex.submit(learner_group, "127.0.0.1", port, 3)
        asyncio.run(eng.init_weights_update_group("127.0.0.1", port, world_size=3, backend="gloo"))
        learner.result(60)
    assert [r[2]["rank_offset"] for f in (a, b) for r in f.requests
            if r[1] == "/init_weights_update_group"] == [1, 2]
    b.stop()
    with pytest.raises(EngineUnavailable,
                       match=rf"begin_weight_update: worker {b.url} is gone .*every worker must take "
                                                "part"):
        asyncio.run(eng.update_weights_from_distributed({"model.norm.weight": torch.zeros(128)},
                                                        lambda t: None))
    assert not a.session_open and a.paths()[-2:] == ["/begin_weight_update", "/end_weight_update"]
    assert eng.weight_version == 0
    asyncio.run(eng.close())


# ---- API keys and https (SGLang's middleware: tests/rollout/fakes/fake_sglang_rules.py check_auth) -------


def test_the_api_key_is_sent_as_a_bearer_token(fakes, tok, tmp_path):
    [f] = fakes(1, api_key="k1")
    with pytest.raises(EngineError,
                       match=rf"^SGLang GET {f.url}/server_info: HTTP 401 {{\"error\": \"Unauthorized\"}} "
                                          r"— the server wants an API key"):
        attach(f.url)  # /health answers without a key (auth.py l. 101-106); the first real call does not
    eng = attach(f.url, api_key="k1")
    gen(eng)
    # api key: admin too
    asyncio.run(eng.update_weights(make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)))
    assert {h.get("Authorization") for h in f.request_headers[-4:]} == {"Bearer k1"}
    asyncio.run(eng.close())
    # --api-key and --admin-api-key: the weight routes want the admin key, which one key cannot be
    [both] = fakes(1, api_key="k1", admin_api_key="adm")
    eng = attach(both.url, api_key="k1")
    gen(eng)
    with pytest.raises(EngineError,
                       match=r"update_weights_from_disk: HTTP 401 .* the server refused the API key"):
        asyncio.run(eng.update_weights(tmp_path / "step1"))
    asyncio.run(eng.close())


def test_https_to_an_sglang_server(fakes, tmp_path):
    cert, key = self_signed_cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    [f] = fakes(1, ssl_context=ctx)
    assert f.url.startswith("https://127.0.0.1:")
    eng = attach(f.url, ca_cert=str(cert))
    assert len(gen(eng).token_ids) == 2
    asyncio.run(eng.close())


# ---- vLLM: data parallel over several URLs, the same rules -------------------------------------------


def vllm_stub() -> StubServer:
    def completions(seen):
        return 200, {"choices": [{"index": i, "token_ids": [5], "finish_reason": "length",
                                  "stop_reason": None,
                                  "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}}
                                 for i in range(seen.body["n"])]}

    return StubServer({"/health": lambda s: (200, b""), "/version": lambda s: (200, {"version": "0.32.0"}),
                       "/v1/models": lambda s: (200, {"data": [{"id": "policy"}]}),
                       "/v1/completions": completions,
                       "/collective_rpc": lambda s: (200, {"results": [None]}),
                       "/reset_prefix_cache": lambda s: (200, {"success": True})}).start()


def test_vllm_workers_round_robin_and_a_worker_that_left_stays_out(tmp_path, caplog):
    a, b = vllm_stub(), vllm_stub()
    try:
        eng = asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(a.url, b.url), retries=2, backoff_s=0.01)))
        for _ in range(4):
            assert gen(eng).token_ids == (5,)
        assert a.paths().count("/v1/completions") == 2 and b.paths().count("/v1/completions") == 2
        assert a.connections == 1  # attach and both generations: one keep-alive connection
        a.stop()
        with caplog.at_level(logging.WARNING, logger="swerl.rollout"):
            assert gen(eng).token_ids == (5,)  # a refuses: it leaves, the call is retried on b
        [warning] = warnings_of(caplog)
        assert (warning.startswith(f"vLLM worker {a.url} left the rotation")
                and "ConnectionRefusedError" in warning)
        a.start()  # back on the same port: it stays out all the same
        seen = len(a.seen)
        gen(eng)
        asyncio.run(eng.update_weights(tmp_path))
        assert len(a.seen) == seen and b.paths().count("/collective_rpc") == 1 and eng.weight_version == 1
        assert eng.generations == 6 and eng.failovers == 1
        b.stop()
        with pytest.raises(EngineUnavailable,
                           match=rf"^no vLLM server left: {a.url} .*; {b.url} \(/v1/completions"):
            gen(eng)
        asyncio.run(eng.close())
    finally:
        a.stop()
        b.stop()
