"""The HTTP client of the inference-server engines (httpx), and retry with backoff.

`HTTPClient` is one `httpx.AsyncClient` per engine: a pool of keep-alive connections over all of the
engine's servers (sized from the engine's concurrency), http and https URLs, an optional API key sent
as `Authorization: Bearer <key>` (what both servers' `--api-key` checks: SGLang 0.5.21 / 0.5.23
`python/sglang/srt/utils/auth.py` l. 108-117 and l. 148-149, the middleware installed at
`entrypoints/http_server.py` 0.5.21 l. 2650, 0.5.23 l. 2894; vllm 0.32
`vllm/entrypoints/serve/middleware/authenticate.py` l. 30-45, installed for `--api-key` or
`VLLM_API_KEY` at `serve/middleware/register.py` l. 33). Both exempt their health routes, so a
missing key shows only on the first real call, as HTTP 401.

Why a thread of its own: swerl calls an engine from one `asyncio.run` after another (each training
step, each weight sync), and an httpx pool is bound to the event loop its connections were opened on.
The client therefore runs its pool on a private event loop in a daemon thread, started on the first
request and stopped by `aclose()` (the engines call it in `close()`); callers on any loop await the
result. Blocking HTTP in worker threads is no option: every episode keeps a generate request open for
seconds, and asyncio's worker threads already carry the sandbox calls.

Errors: an answer of any status is a `Response` (4xx / 5xx are the caller's to judge, never
retried). `ConnectionFailed`: no answer because the connection could not be made, or broke before a
full response (refused, reset, closed, connect timeout); `with_retries` retries those. `EngineTimeout`:
the server took the connection and the request but did not answer in time; not retried (the request
may be running there; a second one would most likely time out too). A TLS failure (an unverifiable
certificate) is an `EngineError` at once: retrying cannot fix it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from swerl.rollout.engine import EngineError, EngineTimeout, EngineUnavailable

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0
"""Seconds a connection may take to open (a request's own timeout caps it too)."""

KEEPALIVE_EXPIRY_S = 4.0
"""Seconds an idle connection is kept for reuse: under the servers' own 5 s (uvicorn's
`timeout_keep_alive`: SGLang's `SGLANG_TIMEOUT_KEEP_ALIVE`, `srt/environ.py` 0.5.21 l. 343, 0.5.23
l. 337; vLLM's `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, vllm 0.32 `envs.py` l. 111), so the client does not
send on a connection the server is closing."""


class ConnectionFailed(ConnectionError):
    """Could not connect, or the server closed the connection before a full response. `refused`:
    nothing listens at the address (the connection was refused), as opposed to a server that dropped it.
    `reason`: what went wrong, without the request (the message names both)."""

    def __init__(self, message: str, *, refused: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.refused = refused
        self.reason = reason or message


class ServerGone(EngineUnavailable):
    """A server did not answer any of the attempts `with_retries` made (connection errors only);
    `url` is the server, `reason` how it failed (attempts, time, the last error)."""

    def __init__(self, message: str, *, url: str, reason: str) -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason


@dataclass(frozen=True)
class Response:
    """A server's answer: its status and body, whatever the status."""

    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, its causes and contexts, and the members of exception groups among them."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        todo.extend(getattr(e, "exceptions", ()) if isinstance(e, BaseExceptionGroup) else ())


def _why(exc: BaseException) -> str:
    """The most specific message of a transport error (the OS's, not httpx's summary)."""
    for e in _chain(exc):
        if isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and e.errno is not None:
            return f"{type(e).__name__}: {e}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _send(client: httpx.AsyncClient, url: str, method: str, path: str, body: Any,
                timeout: float) -> Response:
    where = f"{method} {url}{path}"
    limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
    try:
        resp = await client.request(method, url + path, json=body, timeout=limits)
    except httpx.ConnectTimeout as e:  # the request never reached the server: a connection error
        why = f"no connection within {limits.connect:g} s"
        raise ConnectionFailed(f"{where}: {why}", reason=why) from e
    except httpx.TimeoutException as e:  # read / write / pool: the server has (or may have) the request
        raise EngineTimeout(f"{where}: no response within {timeout:g} s") from e
    except httpx.TransportError as e:  # refused, reset, closed mid-response, TLS
        tls = next((x for x in _chain(e) if isinstance(x, ssl.SSLError)), None)
        if tls is not None:
            raise EngineError(f"{where}: TLS failed ({tls}); for a self-signed certificate set the "
                              "engine's ca_cert to its CA bundle") from e
        refused = any(isinstance(x, ConnectionRefusedError) for x in _chain(e))
        raise ConnectionFailed(f"{where}: {_why(e)}", refused=refused, reason=_why(e)) from e
    return Response(resp.status_code, resp.content)


def _ssl_context(ca_cert: str) -> ssl.SSLContext | bool:
    if not ca_cert:
        return True  # httpx's default: certifi's bundle
    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"ca_cert {ca_cert!r} is not a readable PEM CA bundle: {e}") from e


def _headers(api_key: str) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class HTTPClient:
    """A keep-alive connection pool for an engine's servers, usable from any event loop.

    `max_connections` caps the connections open at once over all servers (requests beyond it wait for
    one to come free, counted in their timeout); that many idle ones are kept alive for reuse.
    `api_key`: sent as `Authorization: Bearer <key>` when not empty. `ca_cert`: a PEM bundle to verify
    https servers with (empty: the usual public CAs). Proxy variables of the environment are ignored:
    the servers are reached directly, as with a plain socket. Call `aclose()` when done."""

    def __init__(self, *, max_connections: int = 64, api_key: str = "", ca_cert: str = "") -> None:
        if max_connections < 1:
            raise ValueError(f"HTTPClient.max_connections must be >= 1, got {max_connections}")
        self.max_connections = max_connections
        self._headers = _headers(api_key)
        self._verify = _ssl_context(ca_cert)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise EngineError("the engine's HTTP client is closed (engine.close() was called)")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                limits = httpx.Limits(max_connections=self.max_connections,
                                      max_keepalive_connections=self.max_connections,
                                      keepalive_expiry=KEEPALIVE_EXPIRY_S)

                async def make() -> httpx.AsyncClient:
                    return httpx.AsyncClient(headers=self._headers, limits=limits, verify=self._verify,
                                             trust_env=False, follow_redirects=False)

                self._thread = threading.Thread(target=loop.run_forever, name="swerl-http", daemon=True)
                self._thread.start()
                self._client = asyncio.run_coroutine_threadsafe(make(), loop).result()
                self._loop = loop
            return self._loop

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            loop = self._start()
        except BaseException:
            coro.close()
            raise
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    async def request(self, url: str, method: str, path: str, body: Any = None, *,
                      timeout: float = 600.0) -> Response:
        """One request to `url` + `path` with an optional JSON body; see the module docstring for
        what it raises. Cancelling the caller cancels the request."""
        async def go() -> Response:
            assert self._client is not None
            return await _send(self._client, url, method, path, body, timeout)

        return await self._on_loop(go())

    async def aclose(self) -> None:
        """Close every connection and stop the client's thread (idempotent); later requests fail."""
        with self._lock:
            loop, client, thread = self._loop, self._client, self._thread
            self._closed, self._loop, self._client, self._thread = True, None, None, None
        if loop is None or client is None or thread is None:
            return
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client.aclose(), loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, 10)
            if not thread.is_alive():
                loop.close()


async def request(url: str, method: str, path: str, body: Any = None, *, timeout: float = 600.0,
                  api_key: str = "", ca_cert: str = "") -> Response:
    """One request on a connection of its own (for one-off calls and tests; engines use their
    `HTTPClient`). Raises as `HTTPClient.request` does."""
    async with httpx.AsyncClient(headers=_headers(api_key), verify=_ssl_context(ca_cert),
                                 trust_env=False) as client:
        return await _send(client, url, method, path, body, timeout)


async def with_retries(call: Callable[[], Awaitable[T]], *, what: str, url: str, retries: int,
                       backoff_s: float) -> T:
    """`call()`, retried on ConnectionFailed with exponential backoff (`backoff_s`, doubled each
    time); after `retries` failed attempts the server counts as gone: `ServerGone`. Answers of any
    HTTP status and timeouts are returned / raised as they are, never retried."""
    delay = backoff_s
    t0 = time.monotonic()
    for attempt in range(1, retries + 1):
        try:
            return await call()
        except ConnectionFailed as e:
            if attempt == retries:
                reason = f"{retries} attempts over {time.monotonic() - t0:.1f} s, last: {e.reason}"
                raise ServerGone(f"{what}: the server is gone ({reason})", url=url, reason=reason) from e
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def check_auth(resp: Response, what: str, *, key_sent: bool) -> Response:
    """The response, unless it is a 401 / 403 (the server's API-key check refused the request): then an
    EngineError saying which key to set. Both servers answer a missing or wrong key with 401
    `{"error": "Unauthorized"}`; SGLang answers 403 for an admin route it locks entirely."""
    if resp.status in (401, 403):
        fix = ("the server refused the API key swerl sent: set the engine's api_key (or SWERL_API_KEY) to "
               "the server's --api-key" if key_sent else
               "the server wants an API key: set the engine's api_key (or SWERL_API_KEY) to its --api-key")
        raise EngineError(f"{what}: HTTP {resp.status} {resp.text[:200].strip()} — {fix}")
    return resp


def expect_ok(resp: Response, what: str) -> Response:
    """The response, if its status is 2xx; else an EngineError quoting the server's answer."""
    if not 200 <= resp.status < 300:
        raise EngineError(f"{what}: HTTP {resp.status}: {resp.text[:500]}")
    return resp


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the weight group's rendezvous port)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
