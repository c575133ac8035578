"""Rollouts: inference engines behind one protocol (`RolloutEngine`: HF in-process, SGLang and vLLM
servers), their configs (`swerl.rollout.config`: `RolloutConfig`) and the one factory that opens them
(`swerl.rollout.factory.open_engine`), and the concurrent episode runner.

May import `swerl.agent`, `swerl.envs`, `swerl.sandbox` (through the runner's pools) and
`swerl.structs`; never the learner or the training loop. torch is imported only by `HFEngine` (loaded
lazily here) so that HTTP-only users stay light. (The tiny test model is `swerl.models.make_tiny_qwen`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swerl.rollout.config import (
    ENGINES,
    EngineConfig,
    HFEngineConfig,
    RolloutConfig,
    SGLangEngineConfig,
    VLLMEngineConfig,
)
from swerl.rollout.engine import EngineError, EngineTimeout, EngineUnavailable, RolloutEngine, WeightSource
from swerl.rollout.factory import open_engine

if TYPE_CHECKING:
    from swerl.rollout.hf import HFEngine
    from swerl.rollout.runner import EpisodeRunner, EpisodeSpec, ResultsWriter, read_results, run_episodes
    from swerl.rollout.sglang import SGLangEngine
    from swerl.rollout.vllm import VLLMEngine

_LAZY = {
    "HFEngine": "swerl.rollout.hf",
    "SGLangEngine": "swerl.rollout.sglang",
    "VLLMEngine": "swerl.rollout.vllm",
    "EpisodeRunner": "swerl.rollout.runner",
    "EpisodeSpec": "swerl.rollout.runner",
    "ResultsWriter": "swerl.rollout.runner",
    "read_results": "swerl.rollout.runner",
    "run_episodes": "swerl.rollout.runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swerl.rollout' has no attribute {name!r}")


__all__ = [
    "ENGINES",
    "EngineConfig",
    "EngineError",
    "EngineTimeout",
    "EngineUnavailable",
    "EpisodeRunner",
    "EpisodeSpec",
    "HFEngine",
    "HFEngineConfig",
    "ResultsWriter",
    "RolloutConfig",
    "RolloutEngine",
    "SGLangEngine",
    "SGLangEngineConfig",
    "VLLMEngine",
    "VLLMEngineConfig",
    "WeightSource",
    "open_engine",
    "read_results",
    "run_episodes",
]
