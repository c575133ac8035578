"""Rollouts: inference engines behind one protocol (`RolloutEngine`: HF in-process, SGLang and vLLM
servers) and the concurrent episode runner.

May import `swerl.agent`, `swerl.envs`, `swerl.sandbox` (through the runner's pools) and
`swerl.structs`; never the learner or the training loop. torch is imported only by `HFEngine` and
`tiny` (loaded lazily here) so that HTTP-only users stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swerl.rollout.engine import EngineError, EngineTimeout, EngineUnavailable, RolloutEngine, WeightSource

if TYPE_CHECKING:
    from swerl.rollout.hf import HFEngine
    from swerl.rollout.runner import EpisodeRunner, EpisodeSpec, ResultsWriter, read_results, run_episodes
    from swerl.rollout.sglang import SGLangEngine
    from swerl.rollout.tiny import make_tiny_qwen
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
    "make_tiny_qwen": "swerl.rollout.tiny",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swerl.rollout' has no attribute {name!r}")


__all__ = [
    "EngineError",
    "EngineTimeout",
    "EngineUnavailable",
    "EpisodeRunner",
    "EpisodeSpec",
    "HFEngine",
    "ResultsWriter",
    "RolloutEngine",
    "SGLangEngine",
    "VLLMEngine",
    "WeightSource",
    "make_tiny_qwen",
    "read_results",
    "run_episodes",
]
