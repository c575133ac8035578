"""Every shipped run config loads into TrainConfig, and the production configs use the learner setup
the memory table (DeepSpeed's estimators, bench_out/memory_table.json) recommends for 8×H100-80GB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swerl.config import load
from swerl.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = {"qwen2.5-coder-1.5b": "qwen2.5-1.5b", "qwen2.5-coder-7b": "qwen2.5-7b",
              "qwen2.5-coder-14b": "qwen2.5-14b", "qwen2.5-coder-32b": "qwen2.5-32b",
              "qwen3-1.7b": "qwen3-1.7b", "qwen3-8b": "qwen3-8b", "qwen3-14b": "qwen3-14b",
              "qwen3-32b": "qwen3-32b"}


# a SandboxSpec
RUN_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if p.stem != "sandbox_default")


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.stem)
def test_config_loads(path):
    cfg = load(TrainConfig, path)
    assert cfg.batch_episodes % cfg.group_size == 0


@pytest.mark.parametrize("name", sorted(PRODUCTION))
def test_production_config_follows_the_memory_table(name):
    rec = json.loads((ROOT / "bench_out" / "memory_table.json").read_text())["recommendations"]
    want = rec[PRODUCTION[name]]["H100-80GB"]
    cfg = load(TrainConfig, ROOT / "configs" / f"{name}.yaml")
    assert cfg.learner.backend == "deepspeed" and cfg.learner.bf16 and cfg.optim.gradient_checkpointing
    assert cfg.learner.zero_stage == want["zero_stage"]
    assert cfg.learner.offload_optimizer == want["offload_optimizer"]
    assert cfg.learner.offload_param == want["offload_param"]
    assert cfg.rollout.engine == "sglang" and cfg.rollout.sglang.tp == want["rollout_tp"]
    assert cfg.optim.micro_batch_tokens == want["micro_batch_tokens"]
    assert cfg.rollout.max_context_tokens == want["context_length"]
    assert cfg.env.kind == "swe" and cfg.algo.aem.enabled and cfg.algo.actfocus.enabled
    if want["nodes"] == 1:
        assert cfg.rollout.sglang.gpus == want["rollout_cuda_visible_devices"] and not cfg.rollout.sglang.urls
    else:
        assert cfg.rollout.sglang.urls  # the second node's server
