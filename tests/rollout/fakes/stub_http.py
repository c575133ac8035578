"""`StubServer`: a tiny local HTTP/1.1 server for the HTTP client's own tests (keep-alive, TLS, API
keys, retries) and for vLLM-shaped topology tests that need no model. Each route is a function of
the request; the server counts the connections it accepts and, like a process that dies, `stop()`
cuts every open connection (keep-alive ones too) and refuses new ones.

`self_signed_cert(dir)` makes a CA-less self-signed certificate for 127.0.0.1 with the `openssl` CLI
(the `cryptography` package is not a dependency).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Seen:
    """One request the stub received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


Route = Callable[[Seen], tuple[int, Any] | None]
"""A request -> (status, JSON-able body or bytes); None: cut the connection without an answer."""


def tracked_handler(owner: Any) -> type[BaseHTTPRequestHandler]:
    """The request handler base both test servers (`StubServer`, `FakeSGLangServer`) build on: HTTP/1.1
    keep-alive, no request log, and each connection counted in `owner.connections` and kept in
    `owner._open` (under `owner._lock`) while it is open, so `stop()` can cut it as a dying process
    would."""

    class Tracked(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive unless the client says otherwise

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def setup(self) -> None:
            super().setup()
            with owner._lock:
                owner.connections += 1
                owner._open.add(self.connection)

        def finish(self) -> None:
            with owner._lock:
                owner._open.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

    return Tracked


def stop_tracked(owner: Any) -> None:
    """Shut `owner._httpd` down as a dying process would: the connections `tracked_handler` keeps in
    `owner._open` (keep-alive ones, and any with a request in flight) are cut, later ones refused."""
    owner._httpd.shutdown()
    owner._httpd.server_close()
    owner._httpd = None
    with owner._lock:
        open_now, owner._open = list(owner._open), set()
    for conn in open_now:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) of a self-signed certificate valid for IP 127.0.0.1 and localhost."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout",
                    str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


class StubServer:
    """Serves `routes` ({path: Route}; unknown paths answer 404) on 127.0.0.1. `port`: a fixed port
    (0: any free one). `cert`: (certfile, keyfile) to serve https. Start with `start()` (or `with`)."""

    def __init__(self, routes: dict[str, Route], *, port: int = 0,
                 cert: tuple[Path, Path] | None = None) -> None:
        self.routes = dict(routes)
        self.seen: list[Seen] = []
        self.connections = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cert = cert
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self.url = ""

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]

    def start(self) -> StubServer:
        httpd = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler())
        httpd.daemon_threads = True
        if self._cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*map(str, self._cert))
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        self._port = httpd.server_address[1]
        self.url = f"{'https' if self._cert else 'http'}://127.0.0.1:{self._port}"
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            stop_tracked(self)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(tracked_handler(self)):
            def _dispatch(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                seen = Seen(method, self.path, dict(self.headers.items()), json.loads(raw) if raw else None)
                with stub._lock:
                    stub.seen.append(seen)
                route = stub.routes.get(self.path.split("?")[0])
                answer = route(seen) if route else (404, {"detail": "Not Found"})
                if answer is None:  # the server vanishes mid-request
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, payload = answer
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

        return Handler
