"""`FakeSGLangServer`: a strict test double of an SGLang server (SGLang needs CUDA; it cannot run on
the build machines). It is not SGLang: it answers the routes `SGLangEngine` uses the way SGLang
0.5.21 or 0.5.23 (`release=`) answers them — request validation, sampling-parameter normalisation,
finish rules, status codes and body shapes — each rule citing the release, file and line it follows
(tests/rollout/fakes/fake_sglang_rules.py holds the request rules; the routes are cited below). A request
that a real server would run but the double cannot (text prompts, non-neutral top_k / min_p /
penalties, stop strings, grammars) gets HTTP 501, which no SGLang sends: the double says what it
cannot do instead of answering wrongly.

Generation is the tiny HF model through `HFEngine`, so token ids and logprobs are real model
outputs. Distributed weight updates are real too, on a gloo group: `/init_weights_update_group`
with `backend: gloo` joins the learner's group (a `ProcessGroupGloo` over a `TCPStore` at
`master_address:master_port`, keys prefixed by the group name: the learner side must build the
same, see `learner_group()`), and `/update_weights_from_distributed` receives the broadcasts and
loads them into the model.

API keys: `api_key=` / `admin_api_key=` are the server's `--api-key` / `--admin-api-key`, checked
as SGLang's middleware does (`rules.check_auth`). `ssl_context=`: serve https with it (SGLang's
`--ssl-certfile` / `--ssl-keyfile`); `url` is then `https://127.0.0.1:<port>`.

Test hooks: `requests` (every request received: method, path with query, JSON body) and
`request_headers` (their headers), `paths()`, `connections` (connections accepted: with keep-alive,
fewer than requests), `drop_next(n)` (close the next n connections without an answer),
`starting_polls` (that many `/health` calls still answer 503: the server is starting), `gate` (clear
it to hold generations "running" until it is set again), `flushes` (prefix-cache flushes done),
`reported_version` (the `version` /server_info reports), `stop()` (the server is gone: its open
connections are cut, new ones refused), `paused` (the mode of /pause_generation in effect, or None) and
`paused_log` (the modes paused with, in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import socket
import ssl
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fakes import fake_sglang_rules as rules
from fakes.fake_sglang_rules import HTTPAnswer
from fakes.stub_http import stop_tracked, tracked_handler
from swerl.rollout.hf import HFEngine
from swerl.structs import Generation, SamplingParams

_LOAD_LOCK = threading.Lock()  # one checkpoint load at a time in this process (see _update_from_disk)

NEUTRAL = {"top_k": rules.TOP_K_ALL, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
           "repetition_penalty": 1.0, "min_new_tokens": 0, "logit_bias": None, "json_schema": None,
           "regex": None, "ebnf": None, "structural_tag": None, "beam_width": None}


def learner_group(master_address: str, master_port: int, world_size: int,
                  group_name: str = "weight_update_group", timeout_s: float = 60.0) -> Any:
    """The learner's side (rank 0) of the gloo group the double joins, as swerl's learner builds it
    (`swerl.rollout.weight_sync.init_custom_process_group`); blocks until every rank joined. Broadcast
    with `torch.distributed.broadcast(t, src=0, group=pg)`. One group of a name per process: the
    double's side lives in its scheduler process."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _world

    from swerl.rollout.weight_sync import init_custom_process_group

    old = next((pg for pg, name in _world.pg_names.items() if name == group_name), None)
    if old is not None:  # an earlier test's group of this name, which torch would refuse to register twice
        dist.destroy_process_group(old)
    return init_custom_process_group("gloo", master_address, master_port, world_size, 0, group_name,
                                     timeout_s)


def _sglang_custom_group(backend: str, master_address: str, master_port: int, world_size: int, rank: int,
                         group_name: str, timeout_s: float) -> Any:
    """SGLang's side of the weight-update group, the torch calls of `init_custom_process_group`
    (sglang 0.5.21 srt/utils/common.py l. 2797-2860) as `WeightUpdater.init_weights_update_group`
    makes them (model_runner_components/weight_updater.py 0.5.21 l. 117-132: rank = rank_offset +
    tp_rank, init_method tcp://address:port): `rendezvous` (rank 0 hosts the TCPStore), the store
    prefixed by the group name, `_new_process_group_helper` (which prefixes it by `<name>/` and the
    device again). A learner whose side is laid out otherwise never meets it (the double's old
    ProcessGroupGloo-on-PrefixStore did, and SGLang would not have)."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size,
                                              timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def _scheduler_process(conn: Any, backend: str, master_address: str, master_port: int, rank: int,
                       world_size: int, group_name: str) -> None:
    """The double's scheduler process: SGLang joins the weight group in its scheduler / TP-worker
    process, not the HTTP server's (and torch registers a group name once per process, so the learner
    of an in-process test could not share one with it). Joins the group, answers ("ok", message) or
    ("error", message), then serves ("recv", names, dtypes, shapes, load_format) by receiving as
    `WeightUpdater.receive_weights_from_distributed` does (model_runner_components/weight_updater.py
    0.5.21 l. 248-306: one broadcast per name from rank 0, async, all waited; with `load_format:
    flattened_bucket` the named tensors are allocated, flattened into one uint8 tensor the way
    `FlattenedTensorBucket` does (srt/weight_sync/tensor_bucket.py 0.5.21 l. 33-62: each tensor's
    bytes in names order) and that one tensor is broadcast, then each rebuilt as a view of it,
    l. 79-90). Tensors go back to the server process as raw bytes."""
    import torch

    try:
        pg = _sglang_custom_group(backend, master_address, master_port, world_size, rank, group_name, 60.0)
    except Exception as e:
        conn.send(("error", f"Failed to initialize custom process group: {e}."))
        return
    conn.send(("ok", "Succeeded to initialize custom process group."))
    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        _, names, dtypes, shapes, load_format = msg
        try:
            named = [(n, torch.empty(shape, dtype=d if isinstance(d, torch.dtype) else getattr(torch, d)))
                     for n, d, shape in zip(names, dtypes, shapes, strict=False)]  # zip: l. 270, 292
            if load_format == "flattened_bucket":
                if not named:
                    raise ValueError("Cannot create empty tensor bucket")  # tensor_bucket.py l. 45-46
                flat = torch.cat([t.flatten().view(torch.uint8) for _, t in named])
                torch.distributed.broadcast(flat, src=0, group=pg)
                out, start = [], 0
                for n, t in named:
                    size = t.numel() * t.element_size()
                    out.append((n, flat[start:start + size].view(t.dtype).reshape(t.shape)))
                    start += size
            else:
                handles = [torch.distributed.broadcast(t, src=0, group=pg, async_op=True) for _, t in named]
                for h in handles:
                    h.wait()
                out = named
            conn.send(("ok", [(n, str(t.dtype).removeprefix("torch."), list(t.shape),
                               t.contiguous().view(torch.uint8).numpy().tobytes()) for n, t in out]))
        except Exception as e:
            conn.send(("error", str(e)))


class _ModelUpdateLock:
    """SGLang's model-update lock: generations hold it shared, weight updates exclusive, and a
    waiting writer keeps new readers out (`RWLock.acquire_reader`, utils/aio_rwlock.py 0.5.21
    l. 43-49; readers in `TokenizerManager.generate_request`, managers/tokenizer_manager.py 0.5.21
    l. 897; the writer in `update_weights_from_disk` l. 2179-2191 and the session/distributed calls,
    managers/tokenizer_control_mixin.py 0.5.21 l. 467-535)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting_writers = 0

    def read(self) -> Any:
        lock = self

        class _Read:
            def __enter__(self) -> None:
                with lock.cond:
                    lock.cond.wait_for(lambda: not lock.writer and lock.waiting_writers == 0)
                    lock.readers += 1

            def __exit__(self, *exc: object) -> None:
                with lock.cond:
                    lock.readers -= 1
                    lock.cond.notify_all()

        return _Read()

    def write(self) -> Any:
        lock = self

        class _Write:
            def __enter__(self) -> None:
                with lock.cond:
                    lock.waiting_writers += 1
                    lock.cond.wait_for(lambda: not lock.writer and lock.readers == 0)
                    lock.waiting_writers -= 1
                    lock.writer = True

            def __exit__(self, *exc: object) -> None:
                with lock.cond:
                    lock.writer = False
                    lock.cond.notify_all()

        return _Write()


class FakeSGLangServer:
    def __init__(self, model_dir: str | Path, *, tokenizer: Any, seed: int = 0, release: str = "0.5.23",
                 context_length: int | None = None, preferred_sampling_params: dict[str, Any] | None = None,
                 starting_polls: int = 0, api_key: str | None = None, admin_api_key: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        if release not in rules.RELEASES:
            raise ValueError(f"FakeSGLangServer emulates {rules.RELEASES}, not {release!r}")
        self.release = release
        self.reported_version = release  # what /server_info says (a test may pretend another release)
        self.model_dir = str(model_dir)
        self.model_path = self.model_dir  # moves with /update_weights_from_disk
        self.tokenizer = tokenizer
        config = json.loads((Path(model_dir) / "config.json").read_text())
        gen_path = Path(model_dir) / "generation_config.json"
        gen_config = json.loads(gen_path.read_text()) if gen_path.exists() else None
        self.config = config
        self.vocab_size = int(config["vocab_size"])
        self.context_len = context_length or rules.context_length(config)  # --context-length wins
        self.eos_ids = rules.eos_token_ids(config, gen_config, tokenizer)
        self.preferred_sampling_params = preferred_sampling_params
        # --weight-version's default (arg_groups/fields/serving.py 0.5.21 l. 165-168)
        self.weight_version = "default"
        self.engine = HFEngine(model_dir, seed=seed, batch_window_s=0.02)
        self.requests: list[tuple[str, str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.api_key, self.admin_api_key = api_key, admin_api_key
        self.connections = 0
        self._open: set[socket.socket] = set()
        self.flushes = 0
        self.starting_polls = starting_polls
        self.gate = threading.Event()
        self.gate.set()
        self.running = 0  # requests in the scheduler (what /flush_cache checks)
        self.session_open = False
        self.paused: str | None = None  # the /pause_generation mode in effect
        self.paused_log: list[str] = []
        self._unpaused = threading.Event()
        self._unpaused.set()
        self.groups: dict[str, Any] = {}
        self._update_lock = _ModelUpdateLock()
        self._drop = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        # `host`: the address it listens on (`--host`; another network host's in the cross-node tests)
        self._httpd: ThreadingHTTPServer | None = ThreadingHTTPServer((host, 0), self._handler())
        self._httpd.daemon_threads = True
        if ssl_context is not None:
            self._httpd.socket = ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://{host}:{self._httpd.server_address[1]}"
        self.startup_time = time.time()

    def __enter__(self) -> FakeSGLangServer:
        self._loop_thread.start()
        self._http_thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the server down as a dying process would: open connections (keep-alive ones, and any
        with a request in flight) are cut, later ones refused."""
        if self._httpd is not None:
            stop_tracked(self)
            self.gate.set()
            self._unpaused.set()
            for proc, conn in self.groups.values():
                with contextlib.suppress(OSError):
                    conn.send(("exit",))
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
            asyncio.run_coroutine_threadsafe(self._close_engine(), self._loop).result(60)
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _close_engine(self) -> None:
        """Close the engine, then wait for the requests it cut: each one's error is retrieved here rather
        than logged when its task is collected (and a log at collection time parses source: see
        tests/test_architecture.py's `_no_collection`)."""
        await self.engine.close()
        cut = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if cut:
            await asyncio.wait(cut, timeout=30)
            for t in cut:
                if t.done() and not t.cancelled():
                    t.exception()

    def drop_next(self, n: int) -> None:
        with self._lock:
            self._drop = n

    def paths(self) -> list[str]:
        """The route of each request received (query strings left out)."""
        return [urlsplit(p).path for _, p, _ in self.requests]

    def wait_running(self, n: int, timeout_s: float = 30.0) -> None:
        """Wait until `n` requests are in the scheduler (test helper)."""
        deadline = time.monotonic() + timeout_s
        while self.running < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.running} requests running, not {n}")
            time.sleep(0.01)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(300)

    # ---- /generate ------------------------------------------------------------------------------

    def _generate(self, body: Any) -> tuple[int, Any]:
        """`POST /generate` (entrypoints/http_server.py 0.5.21 l. 910-960, 0.5.23 l. 928-1000)."""
        if self.release == "0.5.23":
            rules.contract_check(body)  # l. 937-939 of 0.5.23: before anything else
        if not isinstance(body, dict):
            raise rules.validation_error("body: Input should be a valid dictionary")
        batch, single = rules.prompts(body)
        sps = body.get("sampling_params") or {}
        if not all(isinstance(x, dict) for x in (sps if isinstance(sps, list) else [sps])):
            # io_struct.py l. 227
            raise rules.validation_error("sampling_params: Input should be a valid dictionary")
        n = int((sps[0] if isinstance(sps, list) else sps).get("n", 1) or 1)  # io_struct.py 0.5.21 l. 521-547
        if isinstance(sps, list) and len(sps) != len(batch):
            raise NotImplementedError("FakeSGLangServer: one sampling_params dict per batch, or a list as "
                                      "long as it")
        per_prompt = sps if isinstance(sps, list) else [sps] * len(batch)
        want_lp = body.get("return_logprob") or False
        if isinstance(want_lp, list) or body.get("stream"):
            raise NotImplementedError("FakeSGLangServer: per-prompt return_logprob and streaming are not "
                                      "implemented")
        if body.get("logprob_start_len") not in (None, -1):
            raise NotImplementedError("FakeSGLangServer returns output-token logprobs only "
                                      "(logprob_start_len -1)")
        jobs = []
        for ids, raw in zip(batch, per_prompt, strict=True):
            # per request: the context check, then SamplingParams (tokenizer_manager.py 0.5.21 l. 1223-1226,
            # 1478-1480)
            # the raw dict's (l. 1307)
            rules.check_context(len(ids), raw.get("max_new_tokens"), self.context_len)
            sp = rules.sampling_params(raw, self.release, self.vocab_size, self.preferred_sampling_params)
            jobs.append((ids, sp))
        results = self._sample(jobs, n, bool(want_lp))
        return 200, results[0] if single and n == 1 else results

    def _sample(self, jobs: list[tuple[list[int], dict[str, Any]]], n: int, want_lp: bool,
                strict: bool = True) -> list[dict]:
        params = []
        for ids, sp in jobs:
            if not strict:  # the health check's one token: its sampling does not matter
                sp = {**sp, **NEUTRAL, "top_k": 1, "stop": None, "stop_regex": None, "custom_params": None}
            odd = {k: sp[k] for k, v in NEUTRAL.items() if sp[k] != v and not (k == "top_k" and sp[k] == 1)}
            if odd or sp["stop"] or sp["stop_regex"] or sp["custom_params"]:
                raise NotImplementedError("FakeSGLangServer samples with temperature / top_p / stop ids "
                                          f"only, not {odd}")
            if not sp["max_new_tokens"]:
                raise NotImplementedError("FakeSGLangServer needs max_new_tokens >= 1")
            stops = rules.stopping_ids(sp, self.eos_ids)
            temperature = 0.0 if sp["top_k"] == 1 else sp["temperature"]  # top_k 1 is greedy
            params.append((ids, sp, stops, SamplingParams(temperature=temperature, top_p=sp["top_p"],
                                                          max_new_tokens=sp["max_new_tokens"],
                                                          stop_token_ids=tuple(sorted(stops)))))

        async def go() -> list[tuple[Generation, ...]]:
            return list(await asyncio.gather(*(self.engine.generate_n(ids, p, n) for ids, _, _, p in params)))

        # a paused server holds new requests before the model-update lock (tokenizer_manager.py 0.5.21
        # l. 894-895, 0.5.23 l. 939)
        self._unpaused.wait()
        with self._update_lock.read():
            with self._lock:
                self.running += len(jobs) * n
            try:
                gens = self._run(go())
                self.gate.wait()
                # retracted requests answer only after /continue_generation. The double decoded them on the
                # weights they started with; a real server finishes them on the new ones (swerl tags a turn
                # with the version it started on either way)
                self._unpaused.wait()
            finally:
                with self._lock:
                    self.running -= len(jobs) * n
        return [self._one_result(g, ids, sp, stops, want_lp)
                for (ids, sp, stops, _), gs in zip(params, gens, strict=True) for g in gs]

    def _one_result(self, g: Generation, prompt: list[int], sp: dict[str, Any], stops: set[int],
                    want_lp: bool) -> dict[str, Any]:
        """A finished non-streamed result (`TokenizerManager._handle_batch_output`,
        tokenizer_manager.py 0.5.21 l. 2371-2378 and l. 2529-2534; 0.5.23 l. 2506-2513)."""
        out = list(g.token_ids)
        reason = rules.finish_reason(out, stops, sp["max_new_tokens"])
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "finish_reason": reason, "prompt_tokens": len(prompt),
                                "weight_version": self.weight_version, "num_retractions": 0}
        # add_logprob_to_meta_info, l. 2683-2711: [logprob, token_id, null] (no return_text_in_logprobs)
        if want_lp:
            meta["input_token_logprobs"] = []  # logprob_start_len -1: the prompt has none
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(g.logprobs, out, strict=True)]
            meta["output_token_logprobs_length"] = len(out)
        meta.update({"reasoning_tokens": 0, "completion_tokens": len(out), "cached_tokens": 0,
                     "e2e_latency": 0.0})
        text_ids = rules.trim_stop(out, reason, sp["no_stop_trim"])
        text = self.tokenizer.decode(text_ids, skip_special_tokens=sp["skip_special_tokens"])
        return {"text": text, "output_ids": out, "meta_info": meta}

    # ---- health, info, cache --------------------------------------------------------------------

    def _health(self) -> tuple[int, Any]:
        """`GET /health` = `/health_generate` (http_server.py 0.5.21 l. 699-778): 503 while starting
        (l. 713-714); else a one-token generation of prompt [0] (l. 729-752; the default
        SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=1, srt/environ.py 0.5.21 l. 347) and 200, empty body.
        (The real one sleeps 1 s before it looks for the answer, l. 757-758; the double does not.)"""
        with self._lock:
            starting = self.starting_polls > 0
            self.starting_polls -= starting
        if starting:
            return 503, b""
        sp = rules.sampling_params({"max_new_tokens": 1, "temperature": 0.0}, self.release, self.vocab_size,
                                   self.preferred_sampling_params)  # preferred ones apply here too
        self._sample([([0], sp)], 1, False, strict=False)
        return 200, b""

    def _model_info(self) -> dict[str, Any]:
        """`GET /model_info` (http_server.py 0.5.21 l. 790-828); `/get_model_info` answers the same
        (deprecated alias, l. 780-787)."""
        return {"model_path": self.model_path, "served_model_name": self.model_path,
                "tokenizer_path": self.model_dir, "is_generation": True,
                "preferred_sampling_params": self.preferred_sampling_params,
                "weight_version": self.weight_version, "load_format": "auto", "reasoning_parser": None,
                "tool_call_parser": None, "disaggregation_mode": "null", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": self.config.get("model_type"),
                "architectures": self.config.get("architectures")}

    def _server_info(self) -> dict[str, Any]:
        """`GET /server_info` (http_server.py 0.5.21 l. 841-874, 0.5.23 l. 863-894): the resolved
        server args, the scheduler's init info, `version` and `frontend`; `/get_server_info` is the
        deprecated alias. The double sends a subset of the server args."""
        return {"model_path": self.model_dir, "tokenizer_path": self.model_dir, "tp_size": 1, "dp_size": 1,
                "context_length": self.context_len, "weight_version": "default", "status": "ready",
                "max_total_num_tokens": 1 << 20, "max_req_input_len": self.context_len - 6,
                "startup_time": self.startup_time, "internal_states": [{}], "version": self.reported_version,
                "frontend": "python"}

    def _flush_cache(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        """`/flush_cache` (http_server.py 0.5.21 l. 987-1002): the scheduler flushes only when no
        request is running or queued (`Scheduler.flush_cache`, managers/scheduler.py 0.5.21
        l. 5187-5215); with `?timeout=s` it waits up to s for that (`SchedulerFlushWrapper.handle`,
        managers/scheduler_components/flush_wrapper.py 0.5.21 l. 24-39). Refused: 400 and the text
        "Flush cache failed." (FlushCacheReqOutput.message is empty, io_struct.py l. 1758-1760)."""
        timeout = float((query.get("timeout") or ["0"])[0])
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.running:
            return 400, b"Flush cache failed.\n"
        self.flushes += 1
        return 200, (b"Cache flushed.\nPlease check backend logs for more details. (When there are running "
                     b"or waiting requests, the operation will not be performed.)\n")

    # ---- weights ---------------------------------------------------------------------------------

    @staticmethod
    def _require(body: Any, fields: tuple[str, ...]) -> dict[str, Any]:
        """The msgspec request structs' required fields (managers/io_struct.py 0.5.21 l. 1869-1919,
        2025-2038), checked by FastAPI: a missing one is a 400 validation error (extra keys are
        ignored, utils/msgspec_utils.py 0.5.21 l. 95-100)."""
        if not isinstance(body, dict):
            raise rules.validation_error("body: Field required")
        missing = [f for f in fields if f not in body]
        if missing:
            raise rules.validation_error(f"body.{missing[0]}: Field required")
        return body

    def _flush_after_update(self, body: dict[str, Any]) -> None:
        """`flush_cache_after_weight_update` (weight_updater.py 0.5.21 l. 117-122): `flush_cache`
        defaults to true. Under the writer lock nothing runs, so the flush cannot be refused (0.5.23
        would fail the update if it were, l. 120-133)."""
        if body.get("flush_cache", True):
            self.flushes += 1

    def _update_from_disk(self, body: Any) -> tuple[int, Any]:
        """`POST /update_weights_from_disk` (http_server.py 0.5.21 l. 1242-1268): `{success, message,
        num_paused_requests}`, 400 when it failed. Under the writer lock (tokenizer_manager.py 0.5.21
        l. 2179-2191); the load, then the flush (`SchedulerWeightUpdaterManager.update_weights_from_disk`,
        managers/scheduler_components/weight_updater.py 0.5.21 l. 127-150); the model path and weight
        version move (tokenizer_manager.py l. 2192-2195, l. 2231-2236)."""
        body = self._require(body, ("model_path",))
        path = str(body["model_path"])
        # paused: no writer lock, the load happens at once (tokenizer_manager.py 0.5.21 l. 2175-2181,
        # 0.5.23 l. 2307)
        with contextlib.nullcontext() if self.paused else self._update_lock.write():
            if not Path(path).is_dir():  # model_runner_components/weight_updater.py 0.5.21 l. 211-215
                return 400, {"success": False,
                             "message": f"Failed to get weights iterator: no checkpoint at {path}.",
                             "num_paused_requests": 0}
            try:
                # Real servers are separate processes; these doubles share one, and transformers'
                # from_pretrained is not thread-safe (its meta-device init is process-global).
                with _LOAD_LOCK:
                    self._run(self.engine.update_weights(path))
            except Exception as e:  # l. 216-224
                return 400, {"success": False, "num_paused_requests": 0,
                             "message": f"Failed to update weights: {e}.\nRolling back to original weights."}
            self._flush_after_update(body)
            self.model_path = path
            message = "Succeeded to update model weights."
            if body.get("weight_version") is not None:
                self.weight_version = str(body["weight_version"])
                message += f" Weight version updated to {self.weight_version}."
        return 200, {"success": True, "message": message, "num_paused_requests": 0}

    def _init_group(self, body: Any) -> tuple[int, Any]:
        """`POST /init_weights_update_group` (http_server.py 0.5.21 l. 1346-1359) ->
        `WeightUpdater.init_weights_update_group` (model_runner_components/weight_updater.py 0.5.21
        l. 93-137): joins the group as rank `rank_offset` (TP rank 0), blocking until every rank did,
        in the double's scheduler process (`_scheduler_process`). The double has no GPU: backend
        nccl fails as the group init would on a machine without one."""
        body = self._require(body, ("master_address", "master_port", "rank_offset", "world_size"))
        group, backend = body.get("group_name", "weight_update_group"), body.get("backend", "nccl")
        if backend != "gloo":
            return 400, {"success": False, "message": "Failed to initialize custom process group: "
                                                      f"FakeSGLangServer has no GPU for backend {backend!r}."}
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_scheduler_process, daemon=True,
                           args=(child, backend, str(body["master_address"]), int(body["master_port"]),
                                 int(body["rank_offset"]), int(body["world_size"]), group))
        proc.start()
        status, message = parent.recv()
        if status != "ok":
            proc.join(10)
            return 400, {"success": False, "message": message}
        self.groups[group] = (proc, parent)
        return 200, {"success": True, "message": message}

    def _begin(self, body: Any) -> tuple[int, Any]:
        """`POST /begin_weight_update` (http_server.py 0.5.21 l. 1400-1412; 0.5.23 l. 1458): opens the
        session, refused while one is open (weight_updater.py 0.5.21 l. 290-302). The body is the
        request struct (`{}` will do: its one field has a default, io_struct.py 0.5.21 l. 2096-2099)."""
        self._require(body, ())
        with self._update_lock.write():
            if self.session_open:
                return 400, {"success": False, "message": "a weight-update session is already open; "
                                                          "call end_weight_update() first"}
            self.session_open = True
        return 200, {"success": True, "message": "Success"}

    def _end(self, body: Any) -> tuple[int, Any]:
        """`POST /end_weight_update` (http_server.py 0.5.21 l. 1415-1427): closes the session
        (weight_updater.py 0.5.21 l. 304-316)."""
        self._require(body, ())
        with self._update_lock.write():
            if not self.session_open:
                return 400, {"success": False,
                             "message": "no weight-update session is open; call begin_weight_update() first"}
            self.session_open = False
        return 200, {"success": True, "message": "Success"}

    def _update_distributed(self, body: Any) -> tuple[int, Any]:
        """`POST /update_weights_from_distributed` (http_server.py 0.5.21 l. 1430-1447): only inside a
        begin/end session (weight_updater.py 0.5.21 l. 174-184, 0.5.23 l. 187-197); receives one
        broadcast per name from rank 0, in `names` order (model_runner_components/weight_updater.py
        0.5.21 l. 248-285), loads them (l. 320-337) and flushes."""
        body = self._require(body, ("names", "dtypes", "shapes"))
        import torch

        with self._update_lock.write():
            if not self.session_open:
                return 400, {"success": False, "message": "update_weights_from_distributed must run between "
                                                          "begin_weight_update() and end_weight_update()"}
            group = body.get("group_name", "weight_update_group")
            try:
                if group not in self.groups:
                    raise AssertionError(f"Group {group} not in {list(self.groups)}. "
                                         "Please call `init_weights_update_group` first.")
                if body.get("load_format") not in (None, "flattened_bucket"):
                    raise NotImplementedError(f"FakeSGLangServer: load_format {body['load_format']!r}")
                _, conn = self.groups[group]
                conn.send(("recv", body["names"], body["dtypes"], body["shapes"], body.get("load_format")))
                status, payload = conn.recv()
                if status != "ok":
                    raise RuntimeError(payload)
                received = {n: torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, d))
                            .reshape(shape) for n, d, shape, raw in payload}
            except NotImplementedError:
                raise
            except Exception as e:
                return 400, {"success": False, "message": f"Failed to receive weights: {e}"}
            try:
                self._run(self.engine.update_weights({**self.engine.model.state_dict(), **received}))
            except Exception as e:
                return 400, {"success": False,
                             "message": f"Failed to update parameter online: {e}. The full weights "
                                                          "of the ModelRunner are partially updated. Please "
                                                          "discard the whole weights."}
            self._flush_after_update(body)
            message = "Succeeded to update parameter online."
            if body.get("weight_version") is not None:  # tokenizer_control_mixin.py 0.5.21 l. 525-527
                self.weight_version = str(body["weight_version"])
                message += f" Weight version updated to {self.weight_version}."
        return 200, {"success": True, "message": message}

    def _pause(self, body: Any) -> tuple[int, Any]:
        """`POST /pause_generation` (http_server.py 0.5.21 l. 1740-1750, 0.5.23 l. 1831-1841):
        `PauseGenerationReqInput.mode` is abort | retract | in_place, default abort (io_struct.py 0.5.21
        l. 1826-1845, 0.5.23 l. 1927-1946; another value fails validation: 400). The double holds
        requests (new ones wait, running ones answer after /continue_generation), which is retract as
        its caller sees it; abort and in_place it does not do (501)."""
        self._require(body, ())
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise rules.validation_error("body.mode: Input should be 'abort', 'retract' or 'in_place'")
        if mode != "retract":
            raise NotImplementedError(f"FakeSGLangServer pauses in retract mode only, not {mode!r}")
        self.paused = mode
        self.paused_log.append(mode)
        self._unpaused.clear()
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def _continue(self, body: Any) -> tuple[int, Any]:
        """`POST /continue_generation` (http_server.py 0.5.21 l. 1753-1763, 0.5.23 l. 1844-1854): clears
        the pause whether or not one was set (`TokenizerManager.continue_generation`, tokenizer_manager.py
        0.5.21 l. 2155-2159); `ContinueGenerationReqInput`'s one field has a default (io_struct.py 0.5.21
        l. 1848-1854)."""
        self._require(body, ())
        self.paused = None
        self._unpaused.set()
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    # ---- HTTP --------------------------------------------------------------------------------------

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        get, post = method == "GET", method == "POST"
        if path in ("/health", "/health_generate") and get:
            return self._health()
        if path in ("/model_info", "/get_model_info") and get:
            return 200, self._model_info()
        if path in ("/server_info", "/get_server_info") and get:
            return 200, self._server_info()
        if path == "/generate" and method in ("POST", "PUT"):
            return self._generate(body)
        if path == "/flush_cache" and method in ("GET", "POST"):
            return self._flush_cache(query)
        routes = {"/update_weights_from_disk": self._update_from_disk,
                  "/init_weights_update_group": self._init_group, "/begin_weight_update": self._begin,
                  "/end_weight_update": self._end,
                  "/update_weights_from_distributed": self._update_distributed,
                  "/pause_generation": self._pause, "/continue_generation": self._continue}
        if path in routes and post:
            return routes[path](body)
        if path in routes or path in ("/health", "/model_info", "/server_info", "/generate", "/flush_cache"):
            return 405, {"detail": "Method Not Allowed"}
        raise rules.not_found()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(tracked_handler(self)):
            def _answer(self, status: int, payload: Any) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type",
                                     "text/plain" if isinstance(payload, bytes) else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the connection was cut (stop()): nobody to answer
                    self.close_connection = True

            def _dispatch(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with fake._lock:
                    fake.requests.append((method, self.path, json.loads(raw) if raw else None))
                    fake.request_headers.append(dict(self.headers.items()))
                    drop = fake._drop > 0
                    fake._drop -= drop
                if drop:  # the server vanishes mid-request: no status line at all
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                parts = urlsplit(self.path)
                try:
                    rules.check_auth(method, parts.path, self.headers.get("Authorization"), fake.api_key,
                                     fake.admin_api_key)  # the middleware runs before the route
                    body = json.loads(raw) if raw else None
                    self._answer(*fake._route(method, parts.path, parse_qs(parts.query), body))
                except json.JSONDecodeError:
                    self._answer(*_payload(rules.validation_error("JSON decode error")))
                except HTTPAnswer as e:
                    self._answer(e.status, e.payload)
                except NotImplementedError as e:
                    self._answer(501, {"error": {"message": f"not implemented by the double: {e}"}})
                except Exception:  # a bug of the double: say so loudly, answer like an uncaught error
                    traceback.print_exc()
                    self._answer(500, b"Internal Server Error")

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_PUT(self) -> None:
                self._dispatch("PUT")

        return Handler


def _payload(e: HTTPAnswer) -> tuple[int, Any]:
    return e.status, e.payload

