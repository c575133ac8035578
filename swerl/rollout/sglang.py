"""`SGLangEngine`: rollouts on SGLang servers through SGLang's native HTTP API (the production engine).

Supported releases: `SGLANG_SUPPORTED` (0.5.21, the one the Dockerfile pins, to 0.5.23, the latest
checked); `start()` reads each server's version from `GET /server_info` and refuses others in one
line. Every behaviour below was read in those releases' code, cited as (release, file, line) with
files under `python/sglang/srt/`; where 0.5.21 and 0.5.23 differ, both are named.

- `POST /generate` (`entrypoints/http_server.py`: 0.5.21 l. 915, 0.5.23 l. 933) with `input_ids`
  (token ids in, no text round trip), `return_logprob` and `logprob_start_len=-1` (output tokens
  only). The answer's `output_ids` hold every sampled token through the stop
  (`Req.output_ids_through_stop`, `managers/schedule_batch.py` 0.5.21 l. 1438) and
  `meta_info.output_token_logprobs` is one `[logprob, token_id, null]` per token
  (`TokenizerManager.add_logprob_to_meta_info`, `managers/tokenizer_manager.py` 0.5.21 l. 2711);
  `meta_info.finish_reason` is `{"type": "stop", "matched": id}`, `{"type": "length", "length": n}`
  or `{"type": "abort", ...}` (`schedule_batch.py` 0.5.21 l. 270-330). n > 1 answers a list. The
  logprobs are of softmax(logits / temperature) (`Sampler.forward`, `layers/sampler.py` 0.5.21
  l. 248-280; greedy: unscaled, l. 197-199), as HFEngine's; at swerl's rollout temperature 1 the
  model's own distribution.
- Stopping. `Req._check_token_based_finish` (`schedule_batch.py` 0.5.21 l. 1783, 0.5.23 l. 1856)
  returns at once when `ignore_eos` is set: then *no* token stops the turn, `stop_token_ids`
  included, and every turn runs to `max_new_tokens`. So swerl sends `ignore_eos: false`. The server
  then stops at `stop_token_ids` and also at the model's EOS ids (`config.json` /
  `generation_config.json` `eos_token_id`, `ModelConfig._get_hf_eos_token_id`,
  `configs/model_config.py` 0.5.21 l. 1999; the tokenizer's EOS; a few turn-end markers,
  `utils/hf_transformers/common.py` 0.5.21 l. 756): on a checkpoint whose EOS is not the
  end-of-turn token a turn can end at that EOS, reported as a `stop` on it (vLLM, with its own
  `ignore_eos`, would sample on). `no_stop_trim: true` keeps the stop token in the text too
  (`DetokenizerManager.trim_matched_stop`, `managers/detokenizer_manager.py` 0.5.21 l. 189).
- Sampling parameters. A request's `sampling_params` are laid over the server's
  `--preferred-sampling-params` (`TokenizerManager._create_tokenized_object`, 0.5.21 l. 1469), so
  swerl sends every parameter that shapes the distribution at its neutral value (top_k -1, min_p 0,
  penalties neutral, min_new_tokens 0): only swerl's parameters apply. Keys must be the
  `SamplingParams` fields: 0.5.23 refuses an unknown key with HTTP 400 before anything else
  (`generate_contract_error`, `entrypoints/api_contract.py` 0.5.23 l. 12, called at
  `http_server.py` l. 937); 0.5.21 fails it with a TypeError (HTTP 500) when it builds
  `SamplingParams(**kwargs)` (`tokenizer_manager.py` 0.5.21 l. 1478).
- `GET /health` (= `/health_generate`, `http_server.py` 0.5.21 l. 699-778): HTTP 503 while the
  server starts, else it runs a one-token generation and answers 200 once the scheduler answers
  (it sleeps 1 s before it looks). `GET /model_info` (0.5.21 l. 791; `/get_model_info` is its
  deprecated alias, l. 781) and `GET /server_info` (l. 842; `version` at l. 867; alias
  `/get_server_info`).
- `POST /update_weights_from_disk` (0.5.21 l. 1244) `{model_path, weight_version}` -> `{success,
  message, num_paused_requests}`, HTTP 400 when it failed. The server flushes its prefix cache
  itself after the load (`flush_cache: true` by default, `managers/io_struct.py` 0.5.21 l. 1889;
  `SchedulerWeightUpdaterManager.update_weights_from_disk`,
  `managers/scheduler_components/weight_updater.py` 0.5.21 l. 143, 0.5.23 l. 156), under the model
  update lock, i.e. after in-flight generations finished. A separate `/flush_cache` afterwards is
  both redundant and fragile: it answers 400 "Flush cache failed." whenever a request is running
  or queued (`http_server.py` 0.5.21 l. 987-1002, `Scheduler.flush_cache`, `managers/scheduler.py`
  0.5.21 l. 5187); `flush_cache()` here passes `?timeout=` so the server waits for idle.
- Distributed updates: `POST /init_weights_update_group` once, then per step `POST
  /begin_weight_update`, `POST /update_weights_from_distributed {names, dtypes, shapes,
  group_name}` (the learner broadcasts each tensor while it is open), `POST /end_weight_update`.
  Outside a begin/end session the update answers 400 "update_weights_from_distributed must run
  between begin_weight_update() and end_weight_update()" (`weight_updater.py` 0.5.21 l. 179,
  0.5.23 l. 192); a second begin without an end is refused too (0.5.21 l. 292).

Data parallelism: the workers are `urls`; generations go round-robin over them, or to `router_url`
(an sglang-router, which balances) when it is set. Weight updates and flushes go to every worker (a
router does not forward them). Every worker is checked on attach (health, release, model); the router
only for `/health`, which is all swerl asks of it besides `/generate`. What happens when a worker
stops answering: `swerl.rollout.server`. API keys: `--api-key` guards every route but `/health*`,
`/ready*` and `/metrics*` (`utils/auth.py` 0.5.21 l. 98-106 and 145-151); a server that also has
`--admin-api-key` wants that key, not the `--api-key`, on the weight and cache routes (ADMIN_OPTIONAL,
l. 128-143; e.g. `/update_weights_from_disk`, `http_server.py` 0.5.21 l. 1243), so swerl, which
sends one key, needs servers started with one of the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from swerl.rollout.config import SGLangServerConfig
from swerl.rollout.engine import EngineError, EngineUnavailable, WeightSource
from swerl.rollout.http import Response, expect_ok
from swerl.rollout.server import ServerEngine
from swerl.structs import Generation, SamplingParams

SGLANG_SUPPORTED = ("0.5.21", "0.5.23")
"""The SGLang releases (first, last; inclusive) whose HTTP API this client follows and was checked
against: 0.5.21 is the Dockerfile's pin, 0.5.23 the latest release read."""

SGLANG_API = f"sglang {SGLANG_SUPPORTED[0]}-{SGLANG_SUPPORTED[1]}"
"""The supported range, for messages."""


def _release(version: str) -> tuple[int, int, int] | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def check_version(version: Any, url: str = "") -> None:
    """Raise EngineError (one line) unless `version` (a server's `/server_info` `version`) is a
    release in `SGLANG_SUPPORTED`; post-releases / local builds of those count as that release."""
    lo, hi = (_release(v) for v in SGLANG_SUPPORTED)
    rel = _release(version) if isinstance(version, str) else None
    where = f" at {url}" if url else ""
    if rel is None:
        raise EngineError(f"the SGLang server{where} reports no release version ({version!r}); swerl "
                          f"supports {SGLANG_API}")
    assert lo is not None and hi is not None
    if not lo <= rel <= hi:
        raise EngineError(f"the SGLang server{where} runs sglang {version}; swerl's client supports "
                          f"{SGLANG_API} (its HTTP API changes between releases): run a supported release "
                          f"(the Dockerfile pins {SGLANG_SUPPORTED[0]})")


def parse_generate_output(obj: Mapping[str, Any]) -> Generation:
    """One /generate result (one prompt, one sample) -> Generation."""
    meta = obj.get("meta_info")
    if not isinstance(meta, Mapping):
        raise EngineError(f"SGLang /generate answer has no meta_info: {str(obj)[:300]}")
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise EngineError("SGLang /generate answer has no meta_info.output_token_logprobs "
                          "(was return_logprob sent?)")
    ids = [int(e[1]) for e in entries]
    logprobs = [float(e[0]) for e in entries]
    if "output_ids" in obj and list(obj["output_ids"]) != ids:
        raise EngineError(f"SGLang output_ids {obj['output_ids'][:8]}... disagree with the ids in "
                          f"output_token_logprobs {ids[:8]}...")
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind == "stop":
        matched = reason.get("matched") if isinstance(reason, Mapping) else None
        if isinstance(matched, str):
            # swerl sends no stop strings; the one string SGLang reports itself is "NaN happened": a
            # sampled id outside the vocabulary, which it overwrote with a stop id
            # (Req._check_vocab_boundary_finish, schedule_batch.py 0.5.21 l. 1889)
            raise EngineError(f"SGLang ended the turn on {matched!r}: the sampled token was out of the "
                              "vocabulary (NaN logits?) and SGLang replaced it; the turn cannot be trained "
                              "on")
        if isinstance(matched, int) and (not ids or ids[-1] != matched):
            raise EngineError(f"SGLang stopped on token {matched} but did not return it as the last output "
                              "token; swerl needs the stop token in the output (token-exact trajectories)")
        finish = "stop"
    elif kind == "length":
        finish = "length"
    elif kind == "abort":
        finish = "abort"
    else:
        raise EngineError(f"SGLang finish_reason {reason!r} is not stop/length/abort")
    return Generation(token_ids=tuple(ids), logprobs=tuple(logprobs), finish_reason=finish)


def generate_payload(prompt_ids: list[int], params: SamplingParams, n: int = 1) -> dict[str, Any]:
    """The /generate request body for one prompt (n samples of it when n > 1).

    `ignore_eos` is false whenever there are stop ids: with it SGLang skips every token-based stop,
    `stop_token_ids` included (`Req._check_token_based_finish`, schedule_batch.py 0.5.21 l. 1784).
    Without stop ids it is true, so that, as on the other engines, the model's own EOS does not end
    the generation either: only max_new_tokens does. The neutral values of
    top_k, min_p, the penalties and min_new_tokens override any `--preferred-sampling-params` of
    the server, so the distribution sampled is the one `params` names. Every key is a
    `SamplingParams` field of 0.5.21 and 0.5.23 (`sampling/sampling_params.py` 0.5.21 l. 123-154),
    which 0.5.23 enforces."""
    sp: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p, "top_k": -1, "min_p": 0.0,
                          "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                          "min_new_tokens": 0, "max_new_tokens": params.max_new_tokens,
                          "stop_token_ids": list(params.stop_token_ids),
                          "ignore_eos": not params.stop_token_ids, "skip_special_tokens": False,
                          "no_stop_trim": True}
    if n > 1:
        sp["n"] = n
    return {"input_ids": list(prompt_ids), "sampling_params": sp, "return_logprob": True,
            "logprob_start_len": -1, "stream": False}


def error_message(resp: Response) -> str:
    """The message of an SGLang error answer, whichever of its shapes it has: `{"error": {"message"}}`
    (a ValueError, `_create_error_response`, http_server.py 0.5.21 l. 2143), `{"error": "..."}` (0.5.23's
    contract gate, l. 939), `{"message": ...}` (validation errors and the weight routes' `{success,
    message}`), or plain text (`/flush_cache`, a 500)."""
    body = _json_or_none(resp.body)
    if body is not None:
        err = body.get("error")
        if isinstance(err, Mapping) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return resp.text.strip()[:500]


class SGLangEngine(ServerEngine):
    """SGLang servers behind the `RolloutEngine` protocol. Build with `await SGLangEngine.start(cfg)`
    (launches a server when `cfg.urls` is empty, else attaches and checks health and version)."""

    server_name = "SGLang"
    health_poll_s = 0.5
    close_wait_s = 30.0
    flush_timeout_s = 60.0  # /flush_cache waits this long for running requests to finish

    def __init__(self, config: SGLangServerConfig, *, process: subprocess.Popen[bytes] | None = None,
                 urls: tuple[str, ...] | None = None, log_path: Path | None = None) -> None:
        super().__init__(config, process=process, urls=urls, log_path=log_path, router=config.router_url)
        self.versions: dict[str, str] = {}  # worker url -> the sglang release it reported at start
        self._group: tuple[str, ...] = ()  # the workers in the weight-broadcast group, in rank order

    # ---- lifetime ------------------------------------------------------------------------------

    @classmethod
    async def start(cls, config: SGLangServerConfig, *, log_dir: str | os.PathLike[str] | None = None,
                    on_wait: Callable[[str], None] | None = None) -> SGLangEngine:
        return await cls._start(config, launch_command(config), log_dir=log_dir, on_wait=on_wait)

    async def wait_healthy(self, timeout_s: float) -> None:
        """Wait until every worker answers /health (503 while it starts), runs a supported release
        (/server_info) and generates (/model_info); and until the router (if any) answers /health."""
        deadline = time.monotonic() + timeout_s
        if self.router is not None:
            await self._wait_up(self.router, deadline, timeout_s)
        for url in self.urls:
            await self._wait_up(url, deadline, timeout_s)
            self.versions[url] = await self.server_version(url)
            check_version(self.versions[url], url)
            info = await self.model_info(url)
            if info.get("is_generation") is False:
                raise EngineError(f"SGLang server {url} serves a non-generative model "
                                  f"({info.get('model_path')})")

    async def server_version(self, url: str | None = None) -> str:
        """The sglang release a server runs: `version` of `GET /server_info`. Releases before the
        route's rename only have `/get_server_info`; it is asked only to name such a release."""
        url = url or self._first()
        resp = await self._call(url, "GET", "/server_info")
        if resp.status == 404:
            resp = await self._call(url, "GET", "/get_server_info")
        info = expect_ok(resp, f"SGLang {url}/server_info").json()
        return str(info.get("version", "")) if isinstance(info, Mapping) else ""

    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        """`GET /model_info` (every supported release has it; `/get_model_info` is deprecated)."""
        url = url or self._first()
        return expect_ok(await self._call(url, "GET", "/model_info"), f"SGLang {url}/model_info").json()

    def _first(self) -> str:
        return (self.live or self.urls)[0]

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generation]:
        if not prompt_ids:
            raise ValueError("SGLangEngine.generate needs a non-empty prompt")
        url, resp = await self._generate_call("/generate", generate_payload(prompt_ids, params, n))
        if resp.status != 200:
            raise EngineError(f"SGLang {url}/generate: HTTP {resp.status}: {error_message(resp)}")
        out = resp.json()
        items = out if isinstance(out, list) else [out]
        if len(items) != n:
            raise EngineError(f"SGLang {url}/generate answered {len(items)} results for n={n}")
        gens = [parse_generate_output(o) for o in items]
        for g in gens:
            if len(g.token_ids) > params.max_new_tokens:
                raise EngineError(f"SGLang returned {len(g.token_ids)} tokens for "
                                  f"max_new_tokens={params.max_new_tokens}")
        return gens

    # ---- weights -------------------------------------------------------------------------------

    async def update_weights(self, weights: WeightSource) -> None:
        """A checkpoint directory: /update_weights_from_disk on every worker (each flushes its
        own prefix cache). In-process tensors need the distributed path (`init_weights_update_group`
        once, then `update_weights_from_distributed` per step), which needs the learner's process group."""
        if isinstance(weights, Mapping):
            raise EngineError("SGLangEngine.update_weights takes a checkpoint directory; for tensors call "
                              "init_weights_update_group once and update_weights_from_distributed per step")
        await self.update_weights_from_disk(weights)

    async def update_weights_from_disk(self, path: str | os.PathLike[str], *,
                                       load_format: str | None = None) -> None:
        """Every worker reloads weights from `path` (a directory the servers can read) and drops its
        prefix cache; it waits for its running requests first. A worker that is gone leaves the
        rotation (see `swerl.rollout.server`)."""
        version = self.weight_version + 1
        body: dict[str, Any] = {"model_path": os.fspath(path), "weight_version": str(version)}
        if load_format:
            body["load_format"] = load_format

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/update_weights_from_disk", body)
            answer = _json_or_none(resp.body)
            if resp.status != 200 or not (answer or {}).get("success", False):
                raise EngineError(f"SGLang {url} could not load weights from {os.fspath(path)}: "
                                  f"{error_message(resp)}")

        await self._on_workers("update_weights_from_disk", one)
        self.weight_version = version

    async def pause_generation(self) -> None:
        """Pause every worker for a weight update with running requests kept (async training's partial
        rollouts): `POST /pause_generation {"mode": "retract"}` (`entrypoints/http_server.py` 0.5.21
        l. 1740-1750, 0.5.23 l. 1831-1841; the mode is `PauseGenerationReqInput.mode`, abort | retract |
        in_place, default abort, `managers/io_struct.py` 0.5.21 l. 1826-1845, 0.5.23 l. 1927-1946). Retract
        puts the running requests back in the waiting queue with what they generated so far, so the cache
        may be flushed and their KV is recomputed on the new weights after `continue_generation`
        (`Scheduler.pause_generation`, `managers/scheduler.py` 0.5.21 l. 5589-5679); requests that arrive
        meanwhile wait (`TokenizerManager.generate_request`, `managers/tokenizer_manager.py` 0.5.21 l. 894,
        0.5.23 l. 939); and `update_weights_from_disk` on a paused server loads at once instead of waiting
        for the running requests (`model_update_lock` skipped, 0.5.21 l. 2175-2181, 0.5.23 l. 2307).
        (`abort` would end the running requests; `in_place` keeps their old-weight KV cache.)"""

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/pause_generation", {"mode": "retract"})
            if resp.status != 200:
                raise EngineError(f"SGLang {url}/pause_generation: HTTP {resp.status}: {error_message(resp)}")

        await self._on_workers("pause_generation", one)

    async def continue_generation(self) -> None:
        """Undo `pause_generation` on every worker: `POST /continue_generation {}` (http_server.py 0.5.21
        l. 1753-1763, 0.5.23 l. 1844-1854; `ContinueGenerationReqInput`'s one field has a default,
        io_struct.py 0.5.21 l. 1848-1854); the paused requests go on, on the weights loaded meanwhile."""

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/continue_generation", {})
            if resp.status != 200:
                raise EngineError(f"SGLang {url}/continue_generation: HTTP {resp.status}: "
                                  f"{error_message(resp)}")

        await self._on_workers("continue_generation", one)

    async def flush_cache(self, timeout_s: float | None = None) -> None:
        """Drop every worker's prefix cache. A server refuses (400) while requests run, so it is
        asked to wait up to `timeout_s` (default `flush_timeout_s`) for idle. Weight updates flush by
        themselves; this is for other uses."""
        wait = self.flush_timeout_s if timeout_s is None else timeout_s

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", f"/flush_cache?timeout={wait:g}")
            if resp.status != 200:
                raise EngineError(f"SGLang {url}/flush_cache: HTTP {resp.status}: {error_message(resp)} "
                                  f"(requests still running after {wait:g} s?)")

        await self._on_workers("flush_cache", one)

    async def init_weights_update_group(self, master_address: str, master_port: int, world_size: int, *,
                                        group_name: str = "weight_update_group",
                                        backend: str = "nccl") -> None:
        """Ask every worker in rotation to join the learner's weight-broadcast group. The learner is
        rank 0; worker i's TP ranks are `1 + i * tp ...`, so world_size = 1 + tp * len(live). The
        learner must create its side of the group concurrently (the servers block until it does). The
        group needs all of them: a worker lost later stops distributed updates (EngineUnavailable)."""
        group = self.live
        expected = 1 + self.config.tp * len(group)
        if world_size != expected:
            raise ValueError(f"world_size {world_size} != 1 learner + {self.config.tp} TP ranks x "
                             f"{len(group)} servers = {expected}")
        offsets = {u: 1 + i * self.config.tp for i, u in enumerate(group)}

        async def one(url: str) -> None:
            body = {"master_address": master_address, "master_port": master_port,
                    "rank_offset": offsets[url], "world_size": world_size,
                    "group_name": group_name, "backend": backend}
            resp = await self._call(url, "POST", "/init_weights_update_group", body)
            answer = _json_or_none(resp.body) or {}
            if resp.status != 200 or not answer.get("success", False):
                raise EngineError(f"SGLang {url} could not join weight group {group_name!r}: "
                                  f"{error_message(resp)}")

        await self._on_workers("init_weights_update_group", one, tolerate_loss=False)
        self._group = group

    async def _session_call(self, url: str, path: str) -> None:
        resp = await self._call(url, "POST", path, {})
        answer = _json_or_none(resp.body) or {}
        if resp.status != 200 or not answer.get("success", False):
            raise EngineError(f"SGLang {url}{path}: {error_message(resp)}")

    def _check_group(self, what: str) -> None:
        """The weight-broadcast group exists and every one of its ranks is still in the rotation."""
        if not self._group:
            raise EngineError(f"call init_weights_update_group before {what}")
        lost = [u for u in self._group if u not in self.live]
        if lost:
            raise EngineUnavailable(f"SGLang worker(s) {', '.join(lost)} left the rotation; the "
                                    "weight-broadcast group needs every rank — restart the workers and "
                                    "resume the run")

    @contextlib.asynccontextmanager
    async def _weight_session(self) -> AsyncIterator[None]:
        """`/begin_weight_update` on every worker; on leaving, `/end_weight_update` on every server whose
        session began (also after a failure, so the next session can begin). A failed end is raised when
        the body succeeded."""
        began: list[str] = []

        async def begin(url: str) -> None:
            await self._session_call(url, "/begin_weight_update")
            began.append(url)

        try:
            await self._on_workers("begin_weight_update", begin, tolerate_loss=False)
            yield
        finally:
            ends = await asyncio.gather(*(self._session_call(u, "/end_weight_update") for u in began),
                                        return_exceptions=True)
        ended = [e for e in ends if isinstance(e, BaseException)]
        if ended:
            raise ended[0]

    async def _load_from_group(self, body: dict[str, Any], broadcast: Callable[[], None],
                               where: str = "") -> None:
        """One `/update_weights_from_distributed` on every worker while `broadcast()` sends the
        tensors it names on a thread of its own; `where` qualifies the error (e.g. the bucket)."""
        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/update_weights_from_distributed", body)
            answer = _json_or_none(resp.body) or {}
            if resp.status != 200 or not answer.get("success", False):
                raise EngineError(f"SGLang {url} could not update weights from the distributed group"
                                  f"{where}: {error_message(resp)}")

        await asyncio.gather(self._on_workers("update_weights_from_distributed", one, tolerate_loss=False),
                             asyncio.to_thread(broadcast))

    async def update_weights_from_distributed(self, named_tensors: Mapping[str, Any],
                                              broadcast: Callable[[Any], None], *,
                                              group_name: str = "weight_update_group") -> None:
        """One weight-update session on every worker of the group: `/begin_weight_update`, then
        `/update_weights_from_distributed` with the tensors' metadata while the learner (rank 0 of the
        group set up by `init_weights_update_group`) calls `broadcast(tensor)` on each tensor in the
        same order (e.g. `lambda t: dist.broadcast(t, 0, group=g)`), then `/end_weight_update` on every
        server whose session began (also after a failure, so the next session can begin). Each server
        flushes its prefix cache after the load."""
        self._check_group("update_weights_from_distributed")
        names = list(named_tensors)
        version = self.weight_version + 1
        body = {"names": names,
                "dtypes": [str(named_tensors[n].dtype).removeprefix("torch.") for n in names],
                "shapes": [list(named_tensors[n].shape) for n in names],
                "group_name": group_name, "flush_cache": True, "weight_version": str(version)}

        def send_all() -> None:
            for n in names:
                broadcast(named_tensors[n])

        async with self._weight_session():
            await self._load_from_group(body, send_all)
        self.weight_version = version

    async def update_weights_from_buckets(self, buckets: Iterable[Any], broadcast: Callable[[Any], None], *,
                                          group_name: str = "weight_update_group") -> int:
        """One weight-update session streaming buckets (`rollout.weight_sync: memory`; each bucket has
        `names`, `tensors`, `last` and `flattened()`, e.g. `swerl.learner.weights.WeightBucket`):
        `/begin_weight_update`, then per bucket one `/update_weights_from_distributed` with
        `load_format: flattened_bucket` while the learner broadcasts the bucket's bytes once
        (`broadcast(uint8 tensor)`; the server allocates the bucket's tensors, flattens them the
        same way and rebuilds them from the one broadcast: sglang 0.5.21 `srt/model_executor/
        model_runner_components/weight_updater.py` l. 263-306, `srt/weight_sync/tensor_bucket.py`
        l. 19-90), then `/end_weight_update` (also after a failure). Only the last bucket flushes the
        cache and sets the weight version (`flush_cache`, `weight_version`, `srt/managers/io_struct.py`
        l. 1901-1918); a server loads each bucket as it comes (`Scheduler.update_weights_from_distributed`,
        `srt/managers/scheduler_components/weight_updater.py` l. 174-214). The buckets are read on
        this thread, one at a time. Returns the number of buckets sent."""
        self._check_group("update_weights_from_buckets")
        version = self.weight_version + 1
        sent = 0
        async with self._weight_session():
            last = False
            for bucket in buckets:
                if last:
                    raise EngineError("update_weights_from_buckets: a bucket came after the one marked last")
                last = bucket.last
                body: dict[str, Any] = {
                    "names": list(bucket.names),
                    "dtypes": [str(t.dtype).removeprefix("torch.") for t in bucket.tensors],
                    "shapes": [list(t.shape) for t in bucket.tensors], "group_name": group_name,
                    "load_format": "flattened_bucket", "flush_cache": last}
                if last:
                    body["weight_version"] = str(version)
                flat = bucket.flattened()
                await self._load_from_group(body, lambda flat=flat: broadcast(flat), f" (bucket {sent})")
                del flat
                sent += 1
            if not last:
                raise EngineError("update_weights_from_buckets: the stream ended without its last bucket")
        self.weight_version = version
        return sent


def launch_command(config: SGLangServerConfig) -> list[str]:
    """`python -m sglang.launch_server ...` for a config."""
    return [config.python, "-m", "sglang.launch_server", "--model-path", config.model_path,
            "--host", config.host, "--port", str(config.port), "--tp-size", str(config.tp),
            "--mem-fraction-static", str(config.mem_fraction_static), "--dtype", config.dtype,
            *config.extra_args]


def _json_or_none(body: bytes) -> dict[str, Any] | None:
    try:
        out = json.loads(body)
    except ValueError:
        return None
    return out if isinstance(out, dict) else None
