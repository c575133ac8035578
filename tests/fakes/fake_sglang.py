"""`FakeSGLangServer`: a protocol test double of an SGLang server (SGLang needs CUDA; it cannot run
on the build machines). It is a fake: not SGLang, and it implements only what `SGLangEngine` uses.

Request and response shapes follow SGLang's native HTTP API (0.4.6-0.5.x:
`srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`); generation is backed by the tiny HF
model through `HFEngine`, so token ids and logprobs are real model outputs. Test hooks:
`requests` (every request received), `drop_next(n)` (close the next n connections without an
answer), `stop()` (the server is gone).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from swerl.rollout.hf import HFEngine
from swerl.structs import Generation, SamplingParams


class FakeSGLangServer:
    def __init__(self, model_dir: str | Path, *, tokenizer: Any, seed: int = 0) -> None:
        self.model_dir = str(model_dir)
        self.tokenizer = tokenizer
        self.engine = HFEngine(model_dir, seed=seed, batch_window_s=0.02)
        self.requests: list[tuple[str, str, Any]] = []
        self.flushes = 0
        self._drop = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> FakeSGLangServer:
        self._loop_thread.start()
        self._http_thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the server down: later connections are refused."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
            asyncio.run_coroutine_threadsafe(self.engine.close(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)

    def drop_next(self, n: int) -> None:
        with self._lock:
            self._drop = n

    def paths(self) -> list[str]:
        return [p for _, p, _ in self.requests]

    # ---- SGLang's answers ----------------------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(300)

    def _one_result(self, g: Generation, params: SamplingParams, prompt_len: int, return_logprob: bool) -> dict:
        last = g.token_ids[-1] if g.token_ids else None
        if g.finish_reason == "stop":
            reason: dict[str, Any] = {"type": "stop", "matched": last}
        else:
            reason = {"type": "length", "length": params.max_new_tokens}
        meta: dict[str, Any] = {"id": f"fake-{id(g):x}", "finish_reason": reason, "prompt_tokens": prompt_len,
                                "completion_tokens": len(g.token_ids), "cached_tokens": 0}
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(g.logprobs, g.token_ids, strict=True)]
            meta["input_token_logprobs"] = []
        text = self.tokenizer.decode(list(g.token_ids), skip_special_tokens=False)
        return {"text": text, "output_ids": list(g.token_ids), "meta_info": meta}

    def _generate(self, body: dict) -> tuple[int, Any]:
        ids = body.get("input_ids")
        if ids is None:
            return 400, {"error": {"message": "FakeSGLangServer takes input_ids only (no text)"}}
        sp = body.get("sampling_params") or {}
        stops = list(sp.get("stop_token_ids") or [])
        if not sp.get("ignore_eos", False):  # SGLang also stops at the model's EOS unless told not to
            stops.append(self.tokenizer.eos_token_id)
        params = SamplingParams(temperature=sp.get("temperature", 1.0), top_p=sp.get("top_p", 1.0),
                                max_new_tokens=sp.get("max_new_tokens", 128), stop_token_ids=tuple(stops))
        n = int(sp.get("n", 1))
        batch = ids if ids and isinstance(ids[0], list) else [ids]
        want_lp = bool(body.get("return_logprob", False))

        async def go() -> list[list[Generation]]:
            return list(await asyncio.gather(*(self.engine.generate_n(p, params, n) for p in batch)))

        results = [self._one_result(g, params, len(p), want_lp)
                   for p, gens in zip(batch, self._run(go()), strict=True) for g in gens]
        single = not (ids and isinstance(ids[0], list)) and n == 1
        return 200, results[0] if single else results

    def _update_from_disk(self, body: dict) -> tuple[int, Any]:
        path = body.get("model_path")
        try:
            self._run(self.engine.update_weights(path))
        except Exception as e:
            return 400, {"success": False, "message": f"Failed to update weights: {e}", "num_paused_requests": 0}
        return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def _init_group(self, body: dict) -> tuple[int, Any]:
        need = ("master_address", "master_port", "rank_offset", "world_size")
        missing = [k for k in need if k not in body]
        if missing:
            return 400, {"success": False, "message": f"missing {missing}"}
        return 200, {"success": True, "message": "Succeeded to initialize custom process group."}

    def _update_distributed(self, body: dict) -> tuple[int, Any]:
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            return 400, {"success": False, "message": "names, dtypes and shapes must be lists of equal length"}
        # a fake cannot receive NCCL broadcasts: it checks the metadata against its model and says so
        own = self.engine.model.state_dict()
        for n, d, s in zip(names, dtypes, shapes, strict=True):
            if n not in own or list(own[n].shape) != s or str(own[n].dtype).removeprefix("torch.") != d:
                return 400, {"success": False, "message": f"parameter {n} ({d}, {s}) does not match the model"}
        return 200, {"success": True, "message": "Succeeded to update parameter online (metadata only: fake)."}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _answer(self, status: int, payload: Any) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if not isinstance(payload, bytes) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _dispatch(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with fake._lock:
                    fake.requests.append((method, self.path, body))
                    drop = fake._drop > 0
                    fake._drop -= drop
                if drop:  # the server vanishes mid-request: no status line at all
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                route = (method, self.path)
                if route == ("GET", "/health"):
                    self._answer(200, b"")
                elif route == ("GET", "/get_model_info"):
                    self._answer(200, {"model_path": fake.model_dir, "tokenizer_path": fake.model_dir,
                                       "is_generation": True})
                elif self.path == "/generate" and method in ("POST", "PUT"):
                    self._answer(*fake._generate(body or {}))
                elif self.path == "/flush_cache" and method in ("GET", "POST"):
                    fake.flushes += 1
                    self._answer(200, b"Cache flushed.\nPlease check backend logs for more details.\n")
                elif route == ("POST", "/update_weights_from_disk"):
                    self._answer(*fake._update_from_disk(body or {}))
                elif route == ("POST", "/init_weights_update_group"):
                    self._answer(*fake._init_group(body or {}))
                elif route == ("POST", "/update_weights_from_distributed"):
                    self._answer(*fake._update_distributed(body or {}))
                else:
                    self._answer(404, {"detail": "Not Found"})

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_PUT(self) -> None:
                self._dispatch("PUT")

        return Handler
