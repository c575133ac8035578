"""The model under evaluation: the engine section of `swerl eval`'s flags (the same `swerl.rollout.config`
sections training reads, opened by the same `open_engine`), its tokenizer, and a run on it that closes
the engine after."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from swerl.models import check_model_source
from swerl.models.shipped import resolve_model
from swerl.rollout.config import (
    ENGINES,
    EngineConfig,
    HFEngineConfig,
    SGLangEngineConfig,
    VLLMEngineConfig,
)
from swerl.rollout.factory import open_engine

T = TypeVar("T")


def engine_config(engine: str, *, engine_url: str | None = None, seed: int | None = None,
                  startup_timeout_s: float = VLLMEngineConfig.startup_timeout_s,
                  continuous: bool = False, python: str | None = None) -> EngineConfig:
    """The engine section of `swerl eval`'s flags: `hf` runs in this process (CPU, sampling seeded by
    `seed`, batching continuously with `continuous`); `vllm` / `sglang` attach to the comma-separated
    `engine_url` workers when given, else launch a server with the interpreter `python` (the one that has
    the server installed; default `python`), waiting up to `startup_timeout_s` for it."""
    if engine == "hf":
        if engine_url or python:
            flag = "--engine-url" if engine_url else "--engine-python"
            raise ValueError(f"{flag} goes with --engine vllm or sglang (hf runs in this process)")
        return HFEngineConfig(seed=seed, continuous=continuous)
    if continuous:
        raise ValueError(f"--continuous goes with --engine hf ({engine}'s server batches continuously "
                         "already)")
    urls = tuple(u.strip() for u in (engine_url or "").split(",") if u.strip())  # workers, comma-separated
    if python and urls:
        raise ValueError("--engine-python is the interpreter of a launched server; with --engine-url "
                         "nothing is launched (drop one of them)")
    launch = {"python": python} if python else {}
    if engine == "vllm":
        return VLLMEngineConfig(urls=urls, startup_timeout_s=startup_timeout_s, **launch)
    if engine == "sglang":
        return SGLangEngineConfig(urls=urls, startup_timeout_s=startup_timeout_s, **launch)
    raise ValueError(f"unknown engine {engine!r} ({', '.join(ENGINES)})")


def tokenizer_for(model: str, tokenizer: str | None) -> Any:
    """`tokenizer` when given, else the model's own (a checkpoint without tokenizer files: the bundled
    Qwen)."""
    from swerl.agent import load_tokenizer

    if tokenizer:
        return load_tokenizer(tokenizer)
    path = Path(os.path.expanduser(model))
    if path.is_dir() and not (path / "tokenizer_config.json").is_file():
        return load_tokenizer()
    try:
        return load_tokenizer(os.fspath(path) if path.is_dir() else model)
    except RuntimeError as e:
        raise ValueError(f"could not load the tokenizer of --model {model!r} (pass --tokenizer): {e}") from e


def with_model_engine(model: str, out_dir: str | Path, *, engine: str, engine_url: str | None,
                      tokenizer: str | None, seed: int | None, startup_timeout_s: float,
                      run: Callable[[Any, Any], Awaitable[T]], continuous: bool = False,
                      python: str | None = None, concurrency: int = 32) -> T:
    """`run(engine, tokenizer)` on the engine and tokenizer of `model` (an HF directory, a checkpoint the
    training loop exported, or a hub id when the hub is reachable; checked first when it runs in process);
    the engine is closed after. Waiting for a server is said on stderr. `concurrency`: generate calls in
    flight at once (a server client keeps that many connections)."""
    cfg = engine_config(engine, engine_url=engine_url, seed=seed, startup_timeout_s=startup_timeout_s,
                        continuous=continuous, python=python)
    model = resolve_model(model)  # a shipped model's name: its imported directory
    if engine == "hf":
        check_model_source(model)
    tok = tokenizer_for(model, tokenizer)

    def note(line: str) -> None:
        print(f"swerl: {line}", file=sys.stderr, flush=True)

    async def go() -> T:
        if engine != "hf":
            note(f"waiting for the {engine} server at {engine_url or 'a launched server'} (up to "
                 f"{startup_timeout_s:.0f} s, --engine-startup-timeout)")
        eng = await open_engine(cfg, model, concurrency=concurrency, log_dir=Path(out_dir), on_wait=note)
        try:
            return await run(eng, tok)
        finally:
            await eng.close()

    return asyncio.run(go())
