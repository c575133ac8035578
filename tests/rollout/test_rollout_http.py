"""The engines' HTTP client (swerl/rollout/http.py, on httpx) against small local servers: keep-alive
connections, https with a self-signed certificate, the API key, retries on connection errors only,
the refused-attach rule, and the client's lifecycle. No timing races: every wait is on an event."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import threading
import time

import pytest
from fakes.stub_http import StubServer, self_signed_cert

from swerl.rollout import EngineError, EngineTimeout, EngineUnavailable, VLLMEngine
from swerl.rollout.config import ServerConfig, VLLMServerConfig
from swerl.rollout.http import ConnectionFailed, HTTPClient, ServerGone, request, with_retries
from swerl.rollout.server import ServerEngine


def ok(_seen):
    return 200, {"ok": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the https tests need the openssl CLI (apt-get install openssl)")
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def test_one_keep_alive_connection_serves_many_requests_across_event_loops():
    with StubServer({"/x": ok}) as stub:
        client = HTTPClient(max_connections=4)

        async def five():
            return [await client.request(stub.url, "GET", "/x") for _ in range(5)]

        assert [r.json() for r in asyncio.run(five())] == [{"ok": True}] * 5
        # a second event loop (swerl runs one asyncio.run per step) reuses the same pool
        assert asyncio.run(client.request(stub.url, "POST", "/x", {"a": 1})).status == 200
        assert stub.connections == 1 and len(stub.seen) == 6
        assert stub.seen[-1].body == {"a": 1} and stub.seen[-1].headers.get("Connection") != "close"
        assert "Authorization" not in stub.seen[-1].headers
        asyncio.run(client.aclose())


def test_the_pool_holds_at_most_max_connections():
    release = threading.Event()

    def slow(_seen):
        release.wait(30)
        return 200, {}

    with StubServer({"/slow": slow, "/x": ok}) as stub:
        client = HTTPClient(max_connections=2)

        async def go():
            tasks = [asyncio.create_task(client.request(stub.url, "GET", "/slow")) for _ in range(4)]
            while len(stub.seen) < 2:  # two in the server; the other two wait for a free connection
                await asyncio.sleep(0.01)
            assert stub.connections == 2 and not any(t.done() for t in tasks)
            release.set()
            return await asyncio.gather(*tasks)

        assert [r.status for r in asyncio.run(go())] == [200] * 4
        assert stub.connections == 2 and len(stub.seen) == 4
        asyncio.run(client.aclose())


def test_https_with_a_self_signed_certificate(cert):
    with StubServer({"/x": ok}, cert=cert) as stub:
        assert stub.url.startswith("https://")
        client = HTTPClient(ca_cert=str(cert[0]))
        assert asyncio.run(client.request(stub.url, "GET", "/x")).json() == {"ok": True}
        asyncio.run(client.aclose())
        # without the CA: one clear error at once, no retries (it cannot get better)
        t0 = time.monotonic()
        with pytest.raises(EngineError,
                           match=r"TLS failed \(.*CERTIFICATE_VERIFY_FAILED.*set the engine's ca_cert"):
            asyncio.run(request(stub.url, "GET", "/x"))
        assert time.monotonic() - t0 < 5
        with pytest.raises(ValueError, match=r"ca_cert '/nonexistent\.pem' is not a readable PEM CA bundle"):
            HTTPClient(ca_cert="/nonexistent.pem")


def test_an_engine_attaches_over_https_with_its_api_key(cert, monkeypatch):
    models = {"data": [{"id": "policy"}]}

    def guarded(seen):  # vLLM's middleware: Bearer on /v1 routes (authenticate.py l. 30-45, 59)
        if seen.headers.get("Authorization") != "Bearer s3cret":
            return 401, {"error": "Unauthorized"}
        return 200, models

    version = lambda seen: (200, {"version": "0.32.0"})  # noqa: E731  (outside /v1: no key, l. 59)
    with StubServer({"/health": ok, "/version": version, "/v1/models": guarded}, cert=cert) as stub:
        cfg = VLLMServerConfig(urls=(stub.url,), api_key="s3cret", ca_cert=str(cert[0]), backoff_s=0.01)
        assert "s3cret" not in repr(cfg)  # the key stays out of logs and config dumps
        eng = asyncio.run(VLLMEngine.start(cfg))
        assert stub.seen[-1].headers["Authorization"] == "Bearer s3cret"
        asyncio.run(eng.close())
        # the key from the environment when the config has none
        monkeypatch.setenv("SWERL_API_KEY", "s3cret")
        eng = asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(stub.url,), ca_cert=str(cert[0]))))
        asyncio.run(eng.close())
        monkeypatch.delenv("SWERL_API_KEY")
        with pytest.raises(EngineError,
                           match=r"^vLLM GET https://127.0.0.1:\d+/v1/models: HTTP 401 \{\"error\": "
                                              r"\"Unauthorized\"\} — the server wants an API key: set the "
                                              r"engine's api_key \(or SWERL_API_KEY\) to its --api-key$"):
            asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(stub.url,), ca_cert=str(cert[0]))))
        with pytest.raises(EngineError, match=r"HTTP 401 .* the server refused the API key swerl sent"):
            asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(stub.url,), ca_cert=str(cert[0]),
                                                          api_key="wrong")))
        assert sum(s.path == "/v1/models" for s in stub.seen) == 4  # a 401 is never retried


def test_retries_on_connection_errors_until_the_server_comes_up():
    port = free_port()
    stub = StubServer({"/x": ok}, port=port)
    client = HTTPClient()
    attempts = []

    async def call():
        attempts.append(1)
        if len(attempts) == 3:  # refused twice, then the server is there
            stub.start()
        return await client.request(f"http://127.0.0.1:{port}", "GET", "/x")

    try:
        resp = asyncio.run(with_retries(call, what="GET /x", url="u", retries=5, backoff_s=0.01))
        assert resp.status == 200 and len(attempts) == 3 and len(stub.seen) == 1
    finally:
        stub.stop()
    # with nothing listening: ServerGone (an EngineUnavailable) after the last attempt, naming the cause
    with pytest.raises(ServerGone,
                       match=r"GET /x: the server is gone \(3 attempts over .* ConnectionRefusedError"):
        asyncio.run(with_retries(lambda: client.request(f"http://127.0.0.1:{port}", "GET", "/x"),
                                 what="GET /x", url="u", retries=3, backoff_s=0.01))
    asyncio.run(client.aclose())


def test_http_errors_and_timeouts_are_not_retried():
    hold = threading.Event()

    def fail(_seen):
        return 500, b"Internal Server Error"

    def stuck(_seen):
        hold.wait(30)
        return 200, {}

    with StubServer({"/fail": fail, "/stuck": stuck}) as stub:
        client = HTTPClient()

        async def call(path, timeout=60.0):
            return await with_retries(lambda: client.request(stub.url, "POST", path, {}, timeout=timeout),
                                      what=path, url=stub.url, retries=5, backoff_s=0.01)

        assert asyncio.run(call("/fail")).status == 500
        with pytest.raises(EngineTimeout, match=r"POST http://127.0.0.1:\d+/stuck: no response within 0.2 s"):
            asyncio.run(call("/stuck", timeout=0.2))
        hold.set()
        assert stub.paths() == ["/fail", "/stuck"]  # once each
        asyncio.run(client.aclose())


def test_a_dropped_connection_is_a_connection_error():
    def drop(_seen):
        return None  # the server closes the connection without an answer

    with StubServer({"/drop": drop}) as stub:
        with pytest.raises(ConnectionFailed) as info:
            asyncio.run(request(stub.url, "GET", "/drop"))
        assert not info.value.refused
    with pytest.raises(ConnectionFailed) as info:
        asyncio.run(request(stub.url, "GET", "/drop"))  # stopped: refused
    assert info.value.refused


def test_attaching_where_nothing_listens_fails_within_seconds():
    url = f"http://127.0.0.1:{free_port()}"
    cfg = ServerConfig(urls=(url,), startup_timeout_s=300)
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable, match=rf"^nothing listens at {url} \(connection refused for 3 s\)"):
        asyncio.run(ServerEngine._start(cfg, [], log_dir=None))
    assert time.monotonic() - t0 < ServerEngine.attach_refused_s + 5


def test_the_client_is_closed_with_the_engine():
    with StubServer({"/health": ok}) as stub:
        eng = ServerEngine(ServerConfig(urls=(stub.url,)))
        assert eng.http.max_connections == 32 + 2  # concurrency + 2 per server
        assert asyncio.run(eng.health()) == {stub.url: True}
        thread = eng.http._thread
        assert thread is not None and thread.is_alive()
        asyncio.run(eng.close())
        asyncio.run(eng.close())  # idempotent
        assert eng.http.closed and not thread.is_alive()
        assert stub.connections == 1
        with pytest.raises(EngineError, match=r"HTTP client is closed"):
            asyncio.run(eng.http.request(stub.url, "GET", "/health"))


def test_server_config_checks_its_urls():
    for bad, msg in [(("ftp://x",), "is not an http:// or https:// URL"), (("http://",), "with a host"),
                     (("http://a:1", "http://a:1/"), "lists http://a:1 twice"),
                     (("http://a:x",), "bad port")]:
        with pytest.raises(ValueError, match=msg):
            ServerConfig(urls=bad)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        ServerConfig(urls=("http://a:1",), concurrency=0)
    assert ssl.OPENSSL_VERSION  # https support is compiled in


@pytest.mark.parametrize("answer, says", [
    ((200, {"version": "0.31.2"}), "runs vLLM 0.31.2; swerl's client supports vLLM 0.32.x"),
    ((404, {"detail": "Not Found"}), "reports no version"),
])
def test_a_vllm_server_outside_the_supported_series_is_refused_on_attach(answer, says):
    ok = lambda seen: (200, b"")  # noqa: E731
    routes = {"/health": ok, "/version": lambda seen: answer,
              "/v1/models": lambda seen: (200, {"data": [{"id": "p"}]})}
    with StubServer(routes) as stub, pytest.raises(EngineError, match=says):
        asyncio.run(VLLMEngine.start(VLLMServerConfig(urls=(stub.url,), backoff_s=0.01)))
