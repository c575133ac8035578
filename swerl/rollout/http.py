"""A minimal asyncio HTTP/1.1 JSON client for the inference servers, and retry with backoff.

Why not `requests` in threads: every episode keeps a generate request open for seconds, and the
episodes' sandbox calls already use asyncio's worker threads; dozens of blocking HTTP calls would
starve them. Why not aiohttp/httpx: neither is a dependency of swerl, and the servers speak plain
HTTP/1.1 JSON on a trusted network, which needs little: one connection per request
(`Connection: close`), Content-Length or chunked bodies.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from swerl.rollout.engine import EngineError, EngineTimeout, EngineUnavailable

T = TypeVar("T")


class ConnectionFailed(ConnectionError):
    """Could not connect, or the server closed the connection before a full response. `refused`:
    nothing listens at the address (the connection was refused), as opposed to a server that dropped it."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def split_url(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"only http:// server URLs are supported, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"server URL {url!r} has no host")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


async def request(url: str, method: str, path: str, body: Any = None, *, timeout: float = 600.0) -> Response:
    """One HTTP request to `url` + `path` with an optional JSON body. Raises ConnectionFailed on
    connection errors and EngineTimeout when no full response came within `timeout` seconds."""
    host, port, prefix = split_url(url)
    payload = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {prefix}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(payload)}\r\n")
    if body is not None:
        head += "Content-Type: application/json\r\n"
    try:
        return await asyncio.wait_for(_exchange(host, port, (head + "\r\n").encode() + payload), timeout)
    except TimeoutError as e:
        raise EngineTimeout(f"{method} {url}{path}: no response within {timeout} s") from e


async def _exchange(host: str, port: int, raw: bytes) -> Response:
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(raw)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionFailed(f"{host}:{port} closed the connection without a response")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError) as e:
            raise ConnectionFailed(f"{host}:{port} sent a malformed status line {status_line[:80]!r}") from e
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)  # the CRLF after each chunk
            data = b"".join(chunks)
        else:
            data = await reader.read()
        return Response(status, data)
    except (OSError, asyncio.IncompleteReadError) as e:  # refused, reset, cut mid-body
        if isinstance(e, ConnectionFailed):
            raise
        raise ConnectionFailed(f"{host}:{port}: {type(e).__name__}: {e}",
                               refused=isinstance(e, ConnectionRefusedError)) from e
    finally:
        if writer is not None:
            writer.close()


async def with_retries(call: Callable[[], Awaitable[T]], *, what: str, retries: int, backoff_s: float) -> T:
    """`call()`, retried on ConnectionFailed with exponential backoff (`backoff_s`, doubled each
    time); after `retries` failed attempts the server counts as gone: EngineUnavailable."""
    delay = backoff_s
    t0 = time.monotonic()
    for attempt in range(1, retries + 1):
        try:
            return await call()
        except ConnectionFailed as e:
            if attempt == retries:
                raise EngineUnavailable(
                    f"{what}: the server is gone ({retries} attempts over {time.monotonic() - t0:.1f} s, "
                    f"last: {e}); check that it is running (its log says why it stopped) or drop its URL"
                ) from e
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def expect_ok(resp: Response, what: str) -> Response:
    """The response, if its status is 2xx; else an EngineError quoting the server's answer."""
    if not 200 <= resp.status < 300:
        raise EngineError(f"{what}: HTTP {resp.status}: {resp.text[:500]}")
    return resp
