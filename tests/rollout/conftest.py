"""The rollout tests' fixtures: the tiny random-init Qwen2 (built once) and a reference copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TINY_DIR = ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2"


@pytest.fixture(scope="session")
def tiny_model_dir(tok) -> Path:
    """The tiny random-init Qwen2 (head_dim 64, real vocab) with the real tokenizer, built once."""
    from swerl.models import make_tiny_qwen

    return make_tiny_qwen(TINY_DIR, tokenizer=tok)


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir):
    """An independent copy of the tiny model for teacher-forced reference passes."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

