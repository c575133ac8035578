"""`swerl train` with a real vLLM CPU server as the rollout engine: SWE episodes sampled by the server,
the learner's weights written as an HF directory and reloaded by the server every step, so the next
rollouts come from the updated policy (checked against teacher-forced log-probs of the exported
policy). Skip locally with `-m 'not vllm'`."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from rollout_helpers import ROOT, teacher_forced_logprobs
from test_rollout_vllm import free_port, vllm_python

from swerl.config import load
from swerl.models import make_tiny_qwen
from swerl.rollout import VLLMEngine
from swerl.rollout.config import VLLMServerConfig
from swerl.structs import SamplingParams
from swerl.train import TrainConfig, train

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.docker]


def test_train_step_on_vllm_syncs_weights_into_the_server(tmp_path, base_image):
    from transformers import AutoModelForCausalLM

    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    init = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied",
                          tie_word_embeddings=False, tokenizer=tok)
    model_dir = tmp_path / "init"
    shutil.copytree(init, model_dir)
    port = free_port()
    server = asyncio.run(VLLMEngine.start(VLLMServerConfig(
        model_path=str(model_dir), python=vllm_python(), port=port, dtype="float32", max_model_len=4096,
        startup_timeout_s=400, extra_args=("--gpu-memory-utilization", "0.1"),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"),)), log_dir=tmp_path))
    try:
        cfg = load(TrainConfig, "configs/debug_cpu.yaml", [
            f"run_dir={tmp_path / 'run'}", "steps=1", f"model.path={model_dir}", "rollout.engine=vllm",
            f"rollout.vllm.urls=[http://127.0.0.1:{port}]", "rollout.max_new_tokens=16",
            "rollout.max_turns=1", "group_size=2", "batch_episodes=2",
            "env.swe.instance_ids=[toolz__toolz-1]",
            # decoupled weight decay moves every weight even when all advantages are 0 (a random model)
            "optim.lr=0.05", "optim.weight_decay=1.0", "algo.temperature=1.0"])
        rows = train(cfg, log=None)
        assert rows[0]["rollout/episodes_failed"] == 0 and rows[0]["rollout/episodes_trained"] == 2
        synced = tmp_path / "run" / "weights" / "step_00000001"
        assert (synced / "config.json").is_file()
        policy = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "policy").eval()
        before = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        p = tok("def mean(values):")["input_ids"]
        g = asyncio.run(server.generate(p, SamplingParams(max_new_tokens=6)))
        now = teacher_forced_logprobs(policy, p, list(g.token_ids))
        old = teacher_forced_logprobs(before, p, list(g.token_ids))
        assert g.logprobs == pytest.approx(now, abs=1e-3)  # the server samples from the trained policy
        assert max(abs(a - b) for a, b in zip(now, old, strict=True)) > 1e-2  # which differs from the start
    finally:
        asyncio.run(server.close())
