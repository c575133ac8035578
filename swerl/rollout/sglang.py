"""`SGLangEngine`: rollouts on SGLang servers through SGLang's native HTTP API (the production engine).

API followed: SGLang 0.4.6 - 0.5.x, `python/sglang/srt/entrypoints/http_server.py` (routes) and
`python/sglang/srt/managers/io_struct.py` (request fields):

- `POST /generate` with `input_ids` (token ids in: no text round trip), `sampling_params`
  (`temperature`, `top_p`, `max_new_tokens`, `stop_token_ids`, `n`, `ignore_eos`), `return_logprob`
  and `logprob_start_len=-1` (output tokens only). The answer's `meta_info.output_token_logprobs` is
  a list of `[logprob, token_id, text-or-null]`, one per generated token, and
  `meta_info.finish_reason` is `{"type": "stop", "matched": id}`, `{"type": "length", "length": n}`
  or `{"type": "abort", "message": ...}`. A batch (several prompts, or n > 1) answers a list.
- `GET /health`, `GET /get_model_info` (`model_path`, `tokenizer_path`, `is_generation`).
- `POST /update_weights_from_disk` `{model_path, load_format?, weight_version?}` ->
  `{success, message, num_paused_requests}` (HTTP 400 when it failed).
- `POST /init_weights_update_group` `{master_address, master_port, rank_offset, world_size,
  group_name, backend}` and `POST /update_weights_from_distributed` `{names, dtypes, shapes,
  group_name, flush_cache}` -> `{success, message}`: the learner (rank 0 of that group) broadcasts
  each tensor, in `names` order, while the request is open.
- `POST /flush_cache` (drops the radix cache of prefixes computed with the old weights).

Data parallelism: give several server URLs (requests go round-robin) or one sglang-router URL (the
router balances); weight updates and flushes go to `admin_urls`, every worker (a router does not
forward them).

`ignore_eos` is sent as true: the turn ends only at `stop_token_ids` (the episode always includes
the end-of-turn token there), exactly as the other engines behave.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from swerl.rollout.engine import EngineError, WeightSource
from swerl.rollout.http import ConnectionFailed, expect_ok, request
from swerl.rollout.server import ServerEngine
from swerl.structs import Generation, SamplingParams, SGLangServerConfig

SGLANG_API = "0.4.6-0.5.x"
"""The SGLang releases whose native HTTP API this client follows."""


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
    """The /generate request body for one prompt (n samples of it when n > 1)."""
    sp: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p,
                          "max_new_tokens": params.max_new_tokens,
                          "stop_token_ids": list(params.stop_token_ids), "ignore_eos": True,
                          "skip_special_tokens": False, "no_stop_trim": True}
    if n > 1:
        sp["n"] = n
    return {"input_ids": list(prompt_ids), "sampling_params": sp, "return_logprob": True,
            "logprob_start_len": -1, "stream": False}


class SGLangEngine(ServerEngine):
    """SGLang servers behind the `RolloutEngine` protocol. Build with `await SGLangEngine.start(cfg)`
    (launches a server when `cfg.urls` is empty, else attaches and checks health)."""

    server_name = "SGLang"
    health_poll_s = 0.5
    close_wait_s = 30.0

    def __init__(self, config: SGLangServerConfig, *, process: subprocess.Popen[bytes] | None = None,
                 urls: tuple[str, ...] | None = None, log_path: Path | None = None) -> None:
        super().__init__(config, process=process, urls=urls, log_path=log_path)
        self.admin_urls = tuple(u.rstrip("/") for u in (config.admin_urls or self.urls))

    # ---- lifetime ------------------------------------------------------------------------------

    @classmethod
    async def start(cls, config: SGLangServerConfig, *, log_dir: str | os.PathLike[str] | None = None,
                    on_wait: Callable[[str], None] | None = None) -> SGLangEngine:
        return await cls._start(config, launch_command(config), log_dir=log_dir, on_wait=on_wait)

    async def wait_healthy(self, timeout_s: float) -> None:
        """Wait until every server answers /health and /get_model_info says it generates."""
        deadline = time.monotonic() + timeout_s
        for url in dict.fromkeys(self.urls + self.admin_urls):
            await self._wait_up(url, deadline, timeout_s)
            info = await self.model_info(url)
            if info.get("is_generation") is False:
                raise EngineError(f"SGLang server {url} serves a non-generative model ({info.get('model_path')})")

    async def health(self) -> dict[str, bool]:
        """Each server URL -> whether it answers /health with 200 right now."""
        async def one(url: str) -> bool:
            try:
                return (await request(url, "GET", "/health", timeout=10)).status == 200
            except (ConnectionFailed, EngineError):
                return False
        urls = list(dict.fromkeys(self.urls + self.admin_urls))
        return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls)), strict=True))

    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        url = url or self.urls[0]
        return expect_ok(await self._call(url, "GET", "/get_model_info"), f"{url}/get_model_info").json()

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generation]:
        if not prompt_ids:
            raise ValueError("SGLangEngine.generate needs a non-empty prompt")
        url = self._pick()
        resp = expect_ok(await self._call(url, "POST", "/generate", generate_payload(prompt_ids, params, n)),
                         f"SGLang {url}/generate")
        out = resp.json()
        items = out if isinstance(out, list) else [out]
        if len(items) != n:
            raise EngineError(f"SGLang {url}/generate answered {len(items)} results for n={n}")
        gens = [parse_generate_output(o) for o in items]
        for g in gens:
            if len(g.token_ids) > params.max_new_tokens:
                raise EngineError(f"SGLang returned {len(g.token_ids)} tokens for max_new_tokens={params.max_new_tokens}")
        return gens

    # ---- weights -------------------------------------------------------------------------------

    async def update_weights(self, weights: WeightSource) -> None:
        """A checkpoint directory: /update_weights_from_disk on every admin server, then /flush_cache.
        In-process tensors need the distributed path (`init_weights_update_group` once, then
        `update_weights_from_distributed` per step), which needs the learner's process group."""
        if isinstance(weights, Mapping):
            raise EngineError("SGLangEngine.update_weights takes a checkpoint directory; for tensors call "
                              "init_weights_update_group once and update_weights_from_distributed per step")
        await self.update_weights_from_disk(weights)

    async def update_weights_from_disk(self, path: str | os.PathLike[str], *, load_format: str | None = None) -> None:
        """Every admin server reloads weights from `path` (a directory the servers can read)."""
        version = self.weight_version + 1
        body: dict[str, Any] = {"model_path": os.fspath(path), "weight_version": str(version)}
        if load_format:
            body["load_format"] = load_format

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/update_weights_from_disk", body)
            answer = _json_or_none(resp.body)
            if resp.status != 200 or not (answer or {}).get("success", False):
                msg = (answer or {}).get("message", resp.text[:300])
                raise EngineError(f"SGLang {url} could not load weights from {os.fspath(path)}: {msg}")

        await asyncio.gather(*(one(u) for u in self.admin_urls))
        await self.flush_cache()
        self.weight_version = version

    async def flush_cache(self) -> None:
        """Drop every admin server's prefix cache (it holds KV computed with the old weights)."""
        async def one(url: str) -> None:
            expect_ok(await self._call(url, "POST", "/flush_cache"), f"SGLang {url}/flush_cache")

        await asyncio.gather(*(one(u) for u in self.admin_urls))

    async def init_weights_update_group(self, master_address: str, master_port: int, world_size: int, *,
                                        group_name: str = "weight_update_group", backend: str = "nccl") -> None:
        """Ask every admin server to join the learner's weight-broadcast group. The learner is rank 0;
        server i's TP ranks are `1 + i * tp ...`, so world_size = 1 + tp * len(admin_urls). The learner
        must create its side of the group concurrently (the servers block until it does)."""
        expected = 1 + self.config.tp * len(self.admin_urls)
        if world_size != expected:
            raise ValueError(f"world_size {world_size} != 1 learner + {self.config.tp} TP ranks x "
                             f"{len(self.admin_urls)} servers = {expected}")

        async def one(i: int, url: str) -> None:
            body = {"master_address": master_address, "master_port": master_port,
                    "rank_offset": 1 + i * self.config.tp, "world_size": world_size,
                    "group_name": group_name, "backend": backend}
            resp = await self._call(url, "POST", "/init_weights_update_group", body)
            answer = _json_or_none(resp.body) or {}
            if resp.status != 200 or not answer.get("success", False):
                raise EngineError(f"SGLang {url} could not join weight group {group_name!r}: "
                                  f"{answer.get('message', resp.text[:300])}")

        await asyncio.gather(*(one(i, u) for i, u in enumerate(self.admin_urls)))

    async def update_weights_from_distributed(self, named_tensors: Mapping[str, Any],
                                              broadcast: Callable[[Any], None], *,
                                              group_name: str = "weight_update_group") -> None:
        """Send the tensors' metadata to every admin server and, while those requests are open,
        `broadcast(tensor)` each tensor in the same order from the learner (rank 0 of the group set
        up by `init_weights_update_group`; e.g. `lambda t: dist.broadcast(t, 0, group=g)`). Then flush."""
        names = list(named_tensors)
        body = {"names": names,
                "dtypes": [str(named_tensors[n].dtype).removeprefix("torch.") for n in names],
                "shapes": [list(named_tensors[n].shape) for n in names],
                "group_name": group_name, "flush_cache": True}

        async def one(url: str) -> None:
            resp = await self._call(url, "POST", "/update_weights_from_distributed", body)
            answer = _json_or_none(resp.body) or {}
            if resp.status != 200 or not answer.get("success", False):
                raise EngineError(f"SGLang {url} could not update weights from the distributed group: "
                                  f"{answer.get('message', resp.text[:300])}")

        def send_all() -> None:
            for n in names:
                broadcast(named_tensors[n])

        await asyncio.gather(*(one(u) for u in self.admin_urls), asyncio.to_thread(send_all))
        self.weight_version += 1


def launch_command(config: SGLangServerConfig) -> list[str]:
    """`python -m sglang.launch_server ...` for a config."""
    return [config.python, "-m", "sglang.launch_server", "--model-path", config.model_path,
            "--host", config.host, "--port", str(config.port), "--tp-size", str(config.tp),
            "--mem-fraction-static", str(config.mem_fraction_static), "--dtype", config.dtype,
            *config.extra_args]


def _json_or_none(body: bytes) -> dict[str, Any] | None:
    import json

    try:
        out = json.loads(body)
    except ValueError:
        return None
    return out if isinstance(out, dict) else None
