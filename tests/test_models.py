"""Qwen presets: published shapes and sizes, meta-device builds, and loading a user's own config."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import torch

from swerl import models

# Published config.json of Qwen/Qwen2.5-1.5B-Instruct (architecture fields), as on the hub.
QWEN25_15B_INSTRUCT_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02,
    "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
# Published config.json values of Qwen/Qwen3-8B that shape the model.
QWEN3_8B_CONFIG = {
    "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False, "vocab_size": 151936, "attention_bias": False, "eos_token_id": 151645,
}


def hand_count(p: models.QwenPreset) -> tuple[int, int]:
    """(total, embedding) parameters from the architecture, written out per weight."""
    h, inter, hd = p.hidden_size, p.intermediate_size, p.attn_head_dim
    dq, dkv = p.num_attention_heads * hd, p.num_key_value_heads * hd
    if p.model_type == "qwen2":  # q/k/v with bias, no QK-norm
        attn = (h * dq + dq) + 2 * (h * dkv + dkv) + dq * h
    else:  # no bias, RMSNorm of width head_dim on q and on k
        attn = h * dq + 2 * h * dkv + dq * h + 2 * hd
    layer = attn + 3 * h * inter + 2 * h  # SwiGLU gate/up/down + two RMSNorms
    embedding = p.vocab_size * h * (1 if p.tie_word_embeddings else 2)
    return p.num_hidden_layers * layer + embedding + h, embedding  # + the final norm


def within_card(count: int, card: str) -> bool:
    """Within 1%, or within the rounding of the printed figure when that is coarser ("1.7" = ±0.05)."""
    value = Decimal(card) * 10**9
    half_unit = Decimal(5) * Decimal(10) ** (card_exponent(card) - 1) * 10**9
    return abs(Decimal(count) - value) <= max(value / 100, half_unit)


def card_exponent(card: str) -> int:
    decimals = len(card.split(".")[1]) if "." in card else 0
    return -decimals


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_parameter_count_is_exact_and_matches_the_model_card(name):
    p = models.get_preset(name)
    total, embedding = hand_count(p)
    stats = models.param_stats(name)
    assert models.parameter_count(name) == stats.total == total
    assert stats.embedding == embedding
    assert within_card(stats.total, p.card_params_b), (name, stats.total, p.card_params_b)
    assert within_card(stats.non_embedding, p.card_non_embedding_b), (name, stats.non_embedding)
    # DeepSpeed's largest layer for Qwen is the embedding (or the untied LM head, the same size)
    assert stats.largest_layer == p.vocab_size * p.hidden_size


def test_published_sizes_quoted_by_the_hub():
    # the hub's safetensors counts (its model pages, two decimals): the figures people quote
    for name, billions in {"qwen2.5-1.5b": 1.54, "qwen2.5-7b": 7.62, "qwen2.5-14b": 14.77,
                           "qwen2.5-32b": 32.76, "qwen3-8b": 8.19, "qwen3-32b": 32.76}.items():
        assert models.parameter_count(name) / 1e9 == pytest.approx(billions, abs=0.005)  # as printed


def test_within_card_tolerance_is_not_vacuous():
    assert within_card(1_720_000_000, "1.7") and not within_card(1_760_000_000, "1.7")
    assert within_card(7_615_600_000, "7.61") and not within_card(7_700_000_000, "7.61")


def test_meta_models_allocate_nothing_and_have_the_right_class():
    big = models.random_init_model("qwen3-32b")
    assert type(big).__name__ == "Qwen3ForCausalLM"
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in big.parameters())
    small = models.random_init_model("qwen2.5-1.5b")
    assert type(small).__name__ == "Qwen2ForCausalLM"
    assert small.lm_head.weight is small.model.embed_tokens.weight  # tied, as published


def test_preset_configs_equal_the_published_config_json():
    c = models.preset_config("qwen2.5-1.5b").to_dict()
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "hidden_act"):
        assert c[key] == QWEN25_15B_INSTRUCT_CONFIG[key], key
    assert c["rope_parameters"]["rope_theta"] == QWEN25_15B_INSTRUCT_CONFIG["rope_theta"]
    c3 = models.preset_config("qwen3-8b").to_dict()
    assert c3["model_type"] == "qwen3"
    for key, value in QWEN3_8B_CONFIG.items():
        assert c3[key] == value, key


def test_aliases_and_hub_ids_resolve_to_the_same_architecture():
    assert models.get_preset("qwen2.5-coder-32b") is models.PRESETS["qwen2.5-32b"]
    assert models.get_preset("Qwen/Qwen2.5-Coder-7B-Instruct") is models.PRESETS["qwen2.5-7b"]
    assert models.get_preset("Qwen/Qwen3-14B") is models.PRESETS["qwen3-14b"]
    assert models.parameter_count("qwen2.5-coder-1.5b") == models.parameter_count("qwen2.5-1.5b")
    with pytest.raises(KeyError, match=r"qwen2\.5-7b"):
        models.get_preset("qwen2.5-8b")


def test_lora_and_kv_counts_by_hand():
    s = models.param_stats("qwen2.5-1.5b")
    h, kv, inter = 1536, 2 * 128, 8960
    per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + inter) + (inter + h)  # q, k, v, o, gate, up, down
    assert s.lora_params(64) == 28 * 64 * per_layer
    with pytest.raises(ValueError, match="rank"):
        s.lora_params(0)
    assert models.PRESETS["qwen2.5-32b"].kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262144
    assert models.PRESETS["qwen2.5-1.5b"].kv_bytes_per_token == 2 * 28 * 2 * 128 * 2


def test_invalid_preset_is_rejected_with_the_reason():
    with pytest.raises(ValueError, match="not a multiple"):
        models.QwenPreset(**{**models.PRESETS["qwen3-8b"].__dict__, "num_key_value_heads": 5})


# ---- a user's own config / checkpoint -------------------------------------------------------------------


def test_loader_errors_clearly_on_missing_or_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file or directory: .*nope"):
        models.load_model_config(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"directory without a config\.json"):
        models.load_model_config(tmp_path)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON config"):
        models.load_model_config(bad)
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="no `model_type`"):
        models.load_model_config(tmp_path)
    with pytest.raises(KeyError, match="load_model_config"):
        models.preset_config("my-model")


def test_user_config_json_builds_the_same_model_as_the_preset(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_15B_INSTRUCT_CONFIG))
    config = models.load_model_config(tmp_path)
    assert type(config).__name__ == "Qwen2Config"
    built = models.model_from_config(config, device="meta")
    assert models.param_stats_of(built).total == models.parameter_count("qwen2.5-1.5b")
    with pytest.raises(FileNotFoundError, match="no weights"):
        models.load_model(tmp_path)
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        models.load_model(tmp_path / "config.json")


def test_load_model_reads_a_saved_checkpoint(tmp_path):
    from transformers import Qwen3Config

    tiny = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = models.model_from_config(tiny, dtype=torch.float32, device="cpu")
    model.save_pretrained(tmp_path)
    loaded = models.load_model(tmp_path, dtype=torch.float32)
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_tiny_models_are_seeded_and_leave_the_global_rng_alone(tmp_path):
    """Both tiny builders are deterministic in `seed`, differ across seeds, and leave torch's global
    generator where the caller had it (the training loop seeds it once and goes on drawing from it)."""
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    a = models.make_toy_model(12, seed=3)
    b = models.make_toy_model(12, seed=3)
    c = models.make_toy_model(12, seed=4)
    assert torch.equal(torch.rand(4), expected)
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)

    # the same seed set by hand before an unforked build gives the same weights: forking changed nothing
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(3)
    ref = Qwen2ForCausalLM(a.config).float()
    assert torch.equal(ref.get_input_embeddings().weight, wa)

    torch.manual_seed(1234)
    d = models.make_tiny_qwen(tmp_path / "tiny", hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1,
                              intermediate_size=64, seed=5)
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(5)
    fresh = Qwen2ForCausalLM.from_pretrained(d)
    again = Qwen2ForCausalLM(fresh.config).float()
    assert torch.equal(again.get_input_embeddings().weight, fresh.get_input_embeddings().weight)
