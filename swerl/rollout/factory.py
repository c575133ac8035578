"""`open_engine`: the one factory that opens the engine a rollout config names, for `swerl train` and
`swerl eval` alike. It sits above the configs (`swerl.rollout.config`) and the engines, which import
those configs; an engine module is imported only when its kind is opened.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swerl.rollout.config import (
    ENGINES,
    EngineConfig,
    HFEngineConfig,
    ServerConfig,
    SGLangEngineConfig,
    SGLangServerConfig,
    VLLMEngineConfig,
    VLLMServerConfig,
)

if TYPE_CHECKING:
    from swerl.rollout.engine import RolloutEngine


async def open_engine(cfg: EngineConfig, model: str | os.PathLike[str] | Any, *, concurrency: int = 32,
                      log_dir: str | os.PathLike[str] | None = None,
                      on_wait: Callable[[str], None] | None = None) -> RolloutEngine:
    """The engine `cfg` describes, serving `model`.

    hf: `model` is an HF directory (or hub id), loaded in a worker thread, or an already loaded model
    (training passes a copy the learner does not train). vllm / sglang: attach to `cfg.urls` when set,
    else launch a server on `model` (a directory or hub id), its log under `log_dir`, waiting up to
    `cfg.startup_timeout_s` (`on_wait` gets a line now and then meanwhile; a URL where nothing listens
    fails within seconds). `concurrency`: generate calls in flight at once (the runner's
    engine_concurrency), which the HTTP client keeps connections for."""
    if isinstance(cfg, HFEngineConfig):
        from swerl.rollout.hf import HFEngine

        kw = {"seed": cfg.seed, "max_batch": cfg.max_batch, "batch_window_s": cfg.batch_window_s,
              "prefix_cache_mb": cfg.prefix_cache_mb, "continuous": cfg.continuous,
              "kv_headroom": cfg.kv_headroom}
        if isinstance(model, str | os.PathLike):
            return await asyncio.to_thread(HFEngine, model, **kw)  # loading takes a while: keep the loop free
        return HFEngine(model, **kw)
    path = os.fspath(model) if isinstance(model, str | os.PathLike) else ""
    if isinstance(cfg, VLLMEngineConfig):
        from swerl.rollout.vllm import VLLMEngine

        return await VLLMEngine.start(cfg.server_config(path, concurrency=concurrency), log_dir=log_dir,
                                      on_wait=on_wait)
    if isinstance(cfg, SGLangEngineConfig):
        from swerl.rollout.sglang import SGLangEngine

        return await SGLangEngine.start(cfg.server_config(path, concurrency=concurrency), log_dir=log_dir,
                                        on_wait=on_wait)
    raise TypeError(f"open_engine: {cfg!r} is no engine config (one of {', '.join(ENGINES)})")


async def attach_engine(config: ServerConfig) -> RolloutEngine:
    """Another client of servers an engine already uses (`config.urls` set, as `server_config` holds it):
    attached and checked as the first one was (health, release, served model), never launching one. What
    a sandbox host of a cluster generates with (`swerl.cluster`)."""
    if not config.urls:
        raise ValueError("attach_engine: the config names no server URLs to attach to")
    if isinstance(config, SGLangServerConfig):
        from swerl.rollout.sglang import SGLangEngine

        return await SGLangEngine.start(config)
    if isinstance(config, VLLMServerConfig):
        from swerl.rollout.vllm import VLLMEngine

        return await VLLMEngine.start(config)
    raise TypeError(f"attach_engine: {type(config).__name__} is no server config")
