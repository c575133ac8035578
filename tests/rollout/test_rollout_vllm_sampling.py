"""VLLMEngine's `/reset_prefix_cache` answering 200 with `success: false` (vllm 0.32
`entrypoints/serve/dev/cache/api_router.py` l. 20-44) is retried, then an error. (That a checkpoint's
generation_config.json does not set the sampling is checked on the real server in test_rollout_vllm.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from swerl.rollout import EngineError, VLLMEngine
from swerl.rollout.config import VLLMServerConfig


class _ResetStub:
    """Answers `/collective_rpc` with 200 and `/reset_prefix_cache` with `{"success": false}` for the
    first `refusals` calls, then `{"success": true}` — the shapes of vllm 0.32's dev routes."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.resets = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/reset_prefix_cache":
                    stub.resets += 1
                    body = {"success": stub.resets > stub.refusals}
                else:
                    body = {"results": [None]}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_reset_prefix_cache_refusals_are_retried_then_an_error(tmp_path):
    stub = _ResetStub(refusals=2)
    try:
        eng = VLLMEngine(VLLMServerConfig(urls=(stub.url,), backoff_s=0.05))
        asyncio.run(eng.update_weights(tmp_path))
        assert stub.resets == 3 and eng.weight_version == 1
        stub.refusals, stub.resets = 10**6, 0
        eng.reset_cache_wait_s = 0.5
        with pytest.raises(EngineError, match=r"reset_prefix_cache still answers success: false"):
            asyncio.run(eng.update_weights(tmp_path))
        assert stub.resets >= 2 and eng.weight_version == 1
    finally:
        stub.close()
