"""The rollout section: `rollout.engine` selects one engine section, keys of the old flat layout are
rejected with their new names, each section maps onto its engine's own config, and `open_engine` is
the one factory (train and eval)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from swerl.config import ConfigError, help_text, load
from swerl.eval.model import engine_config
from swerl.rollout.config import (
    ENGINE_CONFIGS,
    ENGINES,
    HFEngineConfig,
    RolloutConfig,
    SGLangEngineConfig,
    SGLangServerConfig,
    VLLMEngineConfig,
    VLLMServerConfig,
)
from swerl.rollout.factory import open_engine
from swerl.structs import Span
from swerl.train import TrainConfig


def test_the_engine_kind_selects_its_section():
    cfg = load(TrainConfig, None, ["env.kind=swe", "rollout.engine=sglang", "rollout.sglang.tp=2",
                                     "rollout.vllm.max_model_len=64"])
    assert cfg.rollout.engine_config == SGLangEngineConfig(tp=2)
    assert load(TrainConfig).rollout.engine_config == HFEngineConfig()
    assert ENGINES == ("hf", "vllm", "sglang") and all(ENGINE_CONFIGS[k].kind == k for k in ENGINES)
    with pytest.raises(ConfigError, match=r"rollout\.engine must be one of"):
        load(TrainConfig, None, ["rollout.engine=tgi"])


@pytest.mark.parametrize(("overrides", "new"), [
    (["rollout.engine=sglang", "rollout.urls=[http://a:1]"], "rollout.sglang.urls"),
    (["rollout.engine=vllm", "rollout.python=/x/python"], "rollout.vllm.python"),
    (["rollout.urls=[http://a:1]"], "rollout.vllm.urls or rollout.sglang.urls"),
    (["rollout.engine=sglang", "rollout.mem_fraction=0.5"], "rollout.sglang.mem_fraction"),
    (["rollout.max_model_len=4096"], "rollout.vllm.max_model_len"),
    (["rollout.max_batch=8"], "rollout.hf.max_batch"),
    (["rollout.seed=1"], "rollout.hf.seed"),
])
def test_a_moved_key_is_rejected_with_its_new_name(overrides, new):
    with pytest.raises(ConfigError, match=f"was renamed to {new}$"):
        load(TrainConfig, None, overrides)


def test_an_unknown_key_is_still_unknown():
    with pytest.raises(ConfigError, match="unknown config key"):
        load(TrainConfig, None, ["rollout.hf.urls=[http://a:1]"])


def test_servers_named_for_an_engine_not_in_use_are_an_error():
    with pytest.raises(ConfigError, match=r"rollout\.engine is hf"):
        load(TrainConfig, None, ["rollout.vllm.urls=[http://a:1]"])
    # settings of another engine's section are kept but unused (a YAML made for sglang runs on hf)
    assert load(TrainConfig, None, ["rollout.sglang.tp=2"]).rollout.engine == "hf"


def test_invalid_settings_fail_at_load_in_the_sections_keys():
    with pytest.raises(ConfigError, match=r"rollout.sglang: tp must be >= 1"):
        load(TrainConfig, None, ["rollout.engine=sglang", "rollout.sglang.tp=0"])
    with pytest.raises(ConfigError, match=r"rollout.sglang: mem_fraction must be in"):
        load(TrainConfig, None, ["rollout.engine=sglang", "rollout.sglang.mem_fraction=1.5"])
    with pytest.raises(ConfigError, match=r"rollout.vllm: urls: 'x' is not an http"):
        load(TrainConfig, None, ["rollout.engine=vllm", "rollout.vllm.urls=[x]"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load(TrainConfig, None, ["rollout.engine=vllm", "rollout.vllm.server_env=[A]"])
    with pytest.raises(ConfigError, match=r"rollout\.hf: max_batch must be >= 1"):
        load(TrainConfig, None, ["rollout.hf.max_batch=0"])
    with pytest.raises(ConfigError, match=r"rollout\.hf: kv_headroom must be >= 0"):
        load(TrainConfig, None, ["rollout.hf.kv_headroom=-1"])
    assert load(TrainConfig, None, ["rollout.hf.kv_headroom=0"]).rollout.hf.kv_headroom == 0


def test_a_section_maps_onto_its_engines_config():
    v = VLLMEngineConfig(urls=("http://a:1/",), gpus="2,3", server_env=("A=1=2",), server_args=("--x",),
                         python="/p", dtype="bfloat16", ca_cert="/ca.pem", startup_timeout_s=5,
                         max_model_len=512)
    sc = v.server_config("/m", concurrency=7)
    assert sc == VLLMServerConfig(model_path="/m", urls=("http://a:1",), ca_cert="/ca.pem", concurrency=7,
                                  python="/p", dtype="bfloat16", extra_args=("--x",),
                                  env=(("A", "1=2"), ("CUDA_VISIBLE_DEVICES", "2,3")), startup_timeout_s=5,
                                  max_model_len=512)
    s = SGLangEngineConfig(urls=("http://w:1",), router_url="http://r:1", tp=2, mem_fraction=0.5)
    assert s.server_config("/m", concurrency=3) == SGLangServerConfig(
        model_path="/m", urls=("http://w:1",), router_url="http://r:1", tp=2, mem_fraction_static=0.5,
        concurrency=3)


def test_the_server_defaults_are_the_engines():
    """One default per setting: a section's is its engine config's (eval and train used to differ)."""
    for section, server in ((VLLMEngineConfig(), VLLMServerConfig),
                            (SGLangEngineConfig(), SGLangServerConfig)):
        sc = section.server_config("/m", concurrency=1)
        for f in dataclasses.fields(server):
            if f.name not in ("model_path", "concurrency"):
                assert getattr(sc, f.name) == f.default, f.name
    assert (VLLMEngineConfig().max_model_len == VLLMServerConfig.max_model_len
            == RolloutConfig().max_context_tokens)


def test_swerl_eval_flags_make_the_same_sections():
    assert engine_config("hf") == HFEngineConfig(seed=None)
    assert engine_config("hf", seed=3) == HFEngineConfig(seed=3)
    assert engine_config("vllm", engine_url="http://a:1/, "
                                            "http://b:2", startup_timeout_s=9) == VLLMEngineConfig(
        urls=("http://a:1/", "http://b:2"), startup_timeout_s=9)
    assert engine_config("sglang") == SGLangEngineConfig()
    with pytest.raises(ValueError, match="--engine-url goes with"):
        engine_config("hf", engine_url="http://a:1")
    with pytest.raises(ValueError, match="unknown engine"):
        engine_config("tgi")


def test_help_lists_the_sections_keys():
    keys = {k for k, _, _ in help_text(TrainConfig)}
    assert {"rollout.engine", "rollout.hf.max_batch", "rollout.vllm.urls", "rollout.vllm.max_model_len",
            "rollout.sglang.router_url", "rollout.sglang.tp"} <= keys
    assert all(doc for k, _, doc in help_text(TrainConfig) if k.startswith("rollout."))


def test_open_engine_hf_takes_a_path_or_a_loaded_model(tmp_path):
    from swerl.models import make_tiny_qwen
    from swerl.rollout.hf import HFEngine

    model_dir = make_tiny_qwen(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                               intermediate_size=32)

    async def go(model):
        eng = await open_engine(HFEngineConfig(max_batch=3, seed=5), model)
        try:
            assert isinstance(eng, HFEngine) and eng.max_batch == 3 and eng.batch_window_s == 0.0
            return eng.model
        finally:
            await eng.close()

    loaded = asyncio.run(go(model_dir))
    assert asyncio.run(go(loaded)) is loaded


def test_span_is_one_enum_for_agent_and_algo():
    from swerl import algo

    assert [int(s) for s in Span] == [0, 1, 2]
    assert algo.Span is Span and not any(name.startswith("SPAN_") for name in dir(algo))
