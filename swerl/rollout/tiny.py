"""A tiny random-init Qwen2 model next to the real Qwen tokenizer, for CPU tests, benchmarks and the
debug training loop (no weights can be downloaded on the build machines).

The shapes are chosen so that every engine can serve the same directory: the vocabulary is the real
Qwen2.5 one (151936 rows, so every id the tokenizer produces is valid) and `head_dim` is 64, the
smallest head size vLLM's CPU attention kernels accept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

QWEN_VOCAB = 151936
"""Embedding rows of the Qwen2.5 family: the tokenizer's 151665 ids padded up (as the real models)."""


def make_tiny_qwen(directory: str | os.PathLike[str], *, hidden_size: int = 128, num_layers: int = 2,
                   num_heads: int = 2, num_kv_heads: int = 1, intermediate_size: int = 256,
                   vocab_size: int = QWEN_VOCAB, max_positions: int = 8192, seed: int = 0,
                   dtype: str = "float32", tie_word_embeddings: bool = True, tokenizer: Any = None) -> Path:
    """Write a random-init Qwen2ForCausalLM (config + safetensors) and the tokenizer to `directory`
    and return it. Deterministic in `seed`. An existing model written with the same arguments is
    reused (its `swerl_tiny.json` records them), so session fixtures and benchmarks stay cheap.

    `tie_word_embeddings`: share the embedding with the output layer (as small Qwen models do; half
    the size). vLLM's in-place weight reload breaks the tie, so a model whose weights a vLLM server
    will reload must be untied.
    `tokenizer`: a loaded HF tokenizer, default the bundled Qwen one (`swerl.agent.load_tokenizer`).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swerl.agent import load_tokenizer

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    out = Path(directory)
    args = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
            "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size, "vocab_size": vocab_size,
            "max_positions": max_positions, "seed": seed, "dtype": dtype}
    if not tie_word_embeddings:  # (only recorded when set, so existing tied models stay reusable)
        args["tie_word_embeddings"] = False
    marker = out / "swerl_tiny.json"
    if marker.is_file() and json.loads(marker.read_text()) == args:
        return out
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    if len(tok) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer ({len(tok)} ids)")
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings, rope_theta=1_000_000.0,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    marker.write_text(json.dumps(args))  # last: a half-written directory is never reused
    return out
