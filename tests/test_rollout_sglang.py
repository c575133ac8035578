"""SGLangEngine against FakeSGLangServer, a protocol test double (SGLang itself needs CUDA) whose
generation is the tiny HF model, so ids and logprobs are checked against teacher-forced passes."""

from __future__ import annotations

import asyncio
import sys

import pytest
from fakes.fake_sglang import FakeSGLangServer
from rollout_helpers import teacher_forced_logprobs

from swerl.agent import Engine
from swerl.rollout import EngineError, EngineUnavailable, RolloutEngine, SGLangEngine
from swerl.rollout.sglang import generate_payload, launch_command, parse_generate_output
from swerl.rollout.tiny import make_tiny_qwen
from swerl.structs import SamplingParams, SGLangServerConfig

pytest_plugins = ("rollout_fixtures",)  # tok, tiny_model_dir, reference_model


@pytest.fixture
def fake(tiny_model_dir, tok):
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok) as server:
        yield server


def attach(*urls: str, **kw) -> SGLangEngine:
    cfg = SGLangServerConfig(urls=urls, retries=kw.pop("retries", 4), backoff_s=kw.pop("backoff_s", 0.05), **kw)
    return asyncio.run(SGLangEngine.start(cfg))


def test_generate_returns_the_models_tokens_and_logprobs(fake, tok, reference_model):
    eng = attach(fake.url)
    assert isinstance(eng, RolloutEngine) and isinstance(eng, Engine)
    assert asyncio.run(eng.health()) == {fake.url: True}
    prompt = tok("def mean(values):")["input_ids"]
    g = asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=7, temperature=1.0)))
    assert g.finish_reason == "length" and len(g.token_ids) == 7
    # abs=2e-4 here and below: two fp32 passes of the tiny model (see rollout_helpers)
    assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, prompt, list(g.token_ids)), abs=2e-4)
    # the request is SGLang's native one: token ids in, logprobs of the output only, no text round trip
    _, path, body = fake.requests[-1]
    assert path == "/generate" and body["input_ids"] == prompt and "text" not in body
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    assert body["sampling_params"] == {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 7, "stop_token_ids": [],
                                       "ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True}
    # startup checked /health and /get_model_info
    assert fake.paths()[:2] == ["/health", "/get_model_info"]


def test_stop_token_and_n_samples(fake, tok, reference_model):
    eng = attach(fake.url)
    prompt = tok("The quick brown fox")["input_ids"]
    greedy = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=6)))
    stop = greedy.token_ids[2]
    cut = list(greedy.token_ids).index(stop) + 1
    g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop,))))
    assert g.finish_reason == "stop" and g.token_ids == greedy.token_ids[:cut]
    gens = asyncio.run(eng.generate_n(prompt, SamplingParams(max_new_tokens=4), 3))
    assert len(gens) == 3 and fake.requests[-1][2]["sampling_params"]["n"] == 3
    for x in gens:
        assert x.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, prompt, list(x.token_ids)), abs=2e-4)


def test_parse_generate_output_follows_sglangs_shapes():
    ok = {"text": "ab", "output_ids": [5, 7],
          "meta_info": {"finish_reason": {"type": "stop", "matched": 7},
                        "output_token_logprobs": [[-0.5, 5, None], [-1.25, 7, None]]}}
    g = parse_generate_output(ok)
    assert (g.token_ids, g.logprobs, g.finish_reason) == ((5, 7), (-0.5, -1.25), "stop")
    length = {"meta_info": {"finish_reason": {"type": "length", "length": 1}, "output_token_logprobs": [[-2.0, 9, "x"]]}}
    assert parse_generate_output(length).finish_reason == "length"
    abort = {"meta_info": {"finish_reason": {"type": "abort", "message": "x"}, "output_token_logprobs": []}}
    assert parse_generate_output(abort).finish_reason == "abort"
    with pytest.raises(EngineError, match="did not return it"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "stop", "matched": 8},
                                             "output_token_logprobs": [[-0.5, 5, None]]}})
    with pytest.raises(EngineError, match="return_logprob"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "length"}}})
    assert generate_payload([1, 2], SamplingParams(), 2)["sampling_params"]["n"] == 2


def test_retries_when_the_server_drops_connections(fake, tok):
    eng = attach(fake.url, retries=4)
    prompt = tok("hello")["input_ids"]
    fake.drop_next(2)
    g = asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=3)))
    assert len(g.token_ids) == 3
    assert fake.paths()[-3:] == ["/generate"] * 3  # two dropped, the third answered
    fake.drop_next(10)
    with pytest.raises(EngineUnavailable, match=r"the server is gone \(4 attempts"):
        asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=3)))


def test_a_clear_error_when_the_server_is_gone(fake, tok):
    eng = attach(fake.url, retries=3)
    fake.stop()
    assert asyncio.run(eng.health()) == {fake.url: False}
    with pytest.raises(EngineUnavailable, match=rf"SGLang POST {fake.url}/generate: the server is gone"):
        asyncio.run(eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    with pytest.raises(EngineError, match=r"http://127.0.0.1:9 not healthy after 1 s — raise the start-up timeout"):
        attach("http://127.0.0.1:9", retries=2, startup_timeout_s=1.0)  # nothing listens


def test_weight_update_from_disk_then_flush(fake, tok, tmp_path, reference_model):
    other_dir = make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)
    eng = attach(fake.url)
    prompt = tok("def mean(values):")["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    before = asyncio.run(eng.generate(prompt, greedy))
    asyncio.run(eng.update_weights(other_dir))
    assert eng.weight_version == 1
    seen = [(p, b) for _, p, b in fake.requests if p in ("/update_weights_from_disk", "/flush_cache")]
    assert seen == [("/update_weights_from_disk", {"model_path": str(other_dir), "weight_version": "1"}),
                    ("/flush_cache", None)]
    after = asyncio.run(eng.generate(prompt, greedy))
    assert after.token_ids != before.token_ids
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    assert after.logprobs == pytest.approx(teacher_forced_logprobs(other, prompt, list(after.token_ids)), abs=2e-4)
    with pytest.raises(EngineError, match="could not load weights from /nonexistent"):
        asyncio.run(eng.update_weights("/nonexistent"))
    with pytest.raises(EngineError, match="checkpoint directory"):
        asyncio.run(eng.update_weights(other.state_dict()))


def test_distributed_weight_update_requests(fake, tiny_model_dir, reference_model):
    eng = attach(fake.url)
    asyncio.run(eng.init_weights_update_group("10.0.0.1", 29600, world_size=2, backend="gloo"))
    assert fake.requests[-1][2] == {"master_address": "10.0.0.1", "master_port": 29600, "rank_offset": 1,
                                    "world_size": 2, "group_name": "weight_update_group", "backend": "gloo"}
    with pytest.raises(ValueError, match="world_size 3"):
        asyncio.run(eng.init_weights_update_group("10.0.0.1", 29600, world_size=3))
    state = dict(list(reference_model.state_dict().items())[:3])
    sent = []
    asyncio.run(eng.update_weights_from_distributed(state, sent.append))
    body = fake.requests[-1][2]
    assert body["names"] == list(state) and body["dtypes"] == ["float32"] * 3
    assert body["shapes"] == [list(t.shape) for t in state.values()] and body["flush_cache"] is True
    assert [t.data_ptr() for t in sent] == [t.data_ptr() for t in state.values()]  # broadcast in names order
    import torch

    with pytest.raises(EngineError, match="does not match the model"):
        asyncio.run(eng.update_weights_from_distributed({"model.norm.weight": torch.zeros(3)}, lambda t: None))


def test_several_servers_round_robin_and_updates_reach_all(tiny_model_dir, tok):
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok) as a, FakeSGLangServer(tiny_model_dir, tokenizer=tok) as b:
        eng = attach(a.url, b.url)
        prompt = tok("hi")["input_ids"]

        async def many():
            return await asyncio.gather(*(eng.generate(prompt, SamplingParams(max_new_tokens=2)) for _ in range(6)))

        assert len(asyncio.run(many())) == 6
        assert a.paths().count("/generate") == 3 and b.paths().count("/generate") == 3
        asyncio.run(eng.flush_cache())
        assert a.flushes == b.flushes == 1
        # behind a router: generation goes to the router URL, admin calls to each worker
        cfg = SGLangServerConfig(urls=(a.url,), admin_urls=(a.url, b.url), backoff_s=0.05)
        routed = asyncio.run(SGLangEngine.start(cfg))
        asyncio.run(routed.generate(prompt, SamplingParams(max_new_tokens=2)))
        asyncio.run(routed.flush_cache())
        assert a.paths().count("/generate") == 4 and b.paths().count("/generate") == 3
        assert a.flushes == b.flushes == 2


def test_launching_a_server_that_cannot_start_says_why(tmp_path):
    cfg = SGLangServerConfig(model_path="/models/none", python=sys.executable, port=39123, startup_timeout_s=60)
    assert launch_command(cfg)[:4] == [sys.executable, "-m", "sglang.launch_server", "--model-path"]
    with pytest.raises(EngineError, match=r"exited with code 1 before becoming healthy(.|\n)*No module named 'sglang'"):
        asyncio.run(SGLangEngine.start(cfg, log_dir=tmp_path))
