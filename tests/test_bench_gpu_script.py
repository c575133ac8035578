"""The prepared GPU check (`scripts/gpu_check.sh`, `scripts/bench_train_gpu.py`) runs only when a
session is lent a GPU, so its FLOP count is checked by hand here and every step of it is run on CPU
with tiny shapes: a change that breaks it shows up here, not on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_train_gpu as B  # noqa: E402


def test_model_flops_by_hand() -> None:
    # N = 10 matmul parameters, 2 layers, attention width 4, sequences of 3 and 5 tokens (T = 8,
    # Σs² = 34), one no-grad pass:
    #   train  = 6·10·8 + 6·2·4·34 = 480 + 1632 = 2112
    #   nograd = 2·10·8 + 2·2·4·34 = 160 + 544 = 704
    assert B.model_flops(10, 2, 4, [3, 5], 1) == (2112.0, 704.0)
    assert B.model_flops(10, 2, 4, [3, 5], 0)[1] == 0.0
    # 6 of the 10 are the LM head, which runs at the 5 trained tokens only:
    #   train  = 6·(4·8 + 6·5) + 6·2·4·34 = 372 + 1632 = 2004;  nograd = 2004 / 3 = 668
    assert B.model_flops(10, 2, 4, [3, 5], 1, head_params=6, loss_tokens=5) == (2004.0, 668.0)


def test_matmul_params_counts_a_tied_embedding_once_and_drops_an_untied_input_one() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def model(tied: bool):
        cfg = Qwen2Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)
        return Qwen2ForCausalLM(cfg)

    tied, untied = model(True), model(False)
    # tied: every parameter once (the shared matrix is the LM head); untied: all but the input lookup
    assert B.matmul_params(tied) == sum(p.numel() for p in tied.parameters())
    assert B.matmul_params(untied) == sum(p.numel() for p in untied.parameters()) - 32 * 8


@pytest.mark.slow
def test_gpu_check_runs_every_step_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(["bash", "scripts/gpu_check.sh", "run"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = json.loads((tmp_path / "bench_train_gpu.json").read_text())
    assert [row["zero_stage"] for row in train["rows"]] == [2, 3]
    for row in train["rows"]:
        assert "error" not in row, row
        # one rollout group of 4 episodes of 128 tokens per rank; one training pass, no no-grad pass
        assert row["tokens_per_rank"] == 4 * 128 and row["nograd_passes"] == 0
        assert row["tokens_per_s"] == pytest.approx(row["world_size"] * 4 * 128 / row["update_s"])
        assert row["mfu"] is None  # no peak on CPU
        assert row["loss"] == row["loss"] and row["grad_norm"] > 0
    assert train["meta"]["precision"] == "bf16 + grad ckpt"
    nockpt = json.loads((tmp_path / "bench_train_gpu_nockpt.json").read_text())
    assert nockpt["meta"]["precision"] == "bf16" and [row["zero_stage"] for row in nockpt["rows"]] == [2]
    algo = json.loads((tmp_path / "bench_algo_cuda.json").read_text())
    assert algo["meta"]["device"] == "cpu"
