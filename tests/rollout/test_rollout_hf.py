"""HFEngine: batched in-process generation on the tiny random-init Qwen2 with the real tokenizer.
Expected values come from independent teacher-forced / greedy passes of a separately loaded copy."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rollout_helpers import greedy_reference, teacher_forced_logprobs

from swerl.agent import Engine
from swerl.models import make_tiny_qwen
from swerl.rollout import EngineError, HFEngine, RolloutEngine
from swerl.structs import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(tiny_model_dir, seed=0, batch_window_s=0.05)


def prompts(tok) -> list[list[int]]:
    texts = ["def mean(values):", "The quick brown fox jumps over the lazy dog. " * 3, "x"]
    return [tok(t)["input_ids"] for t in texts]


def test_hf_engine_implements_both_protocols(engine):
    assert isinstance(engine, RolloutEngine) and isinstance(engine, Engine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_concurrent_calls_are_batched_and_logprobs_match_teacher_forcing(engine, tok, reference_model,
                                                                         temperature):
    ps = prompts(tok)  # different lengths: the batch is left-padded
    params = SamplingParams(temperature=temperature, max_new_tokens=12)
    before = len(engine.batch_sizes)

    async def go():
        return await asyncio.gather(*(engine.generate(p, params) for p in ps))

    gens = asyncio.run(go())
    assert engine.batch_sizes[before:] == [3]  # one batched decode for the three concurrent calls
    for p, g in zip(ps, gens, strict=True):
        assert g.finish_reason == "length" and len(g.token_ids) == 12
        expected = teacher_forced_logprobs(reference_model, p, list(g.token_ids), temperature)
        assert g.logprobs == pytest.approx(expected, abs=2e-4)  # two fp32 passes: see rollout_helpers


def test_greedy_matches_a_step_by_step_reference(engine, tok, reference_model):
    ps = prompts(tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)

    async def go():
        return await asyncio.gather(*(engine.generate(p, params) for p in ps))

    for p, g in zip(ps, asyncio.run(go()), strict=True):
        assert list(g.token_ids) == greedy_reference(reference_model, p, 6)
        # greedy logprobs are the unscaled ones
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, p, list(g.token_ids)),
                                           abs=2e-4)


def test_a_tiny_top_p_keeps_only_the_most_likely_token(engine, tok, reference_model):
    p = prompts(tok)[0]
    g = asyncio.run(engine.generate(p, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=5)))
    assert list(g.token_ids) == greedy_reference(reference_model, p, 5)


def test_stop_tokens_end_the_turn_and_are_included(engine, tok, reference_model):
    p = prompts(tok)[1]
    greedy = greedy_reference(reference_model, p, 8)
    k = 4
    stop = greedy[k]
    first = greedy.index(stop)  # the turn ends at the first occurrence
    g = asyncio.run(engine.generate(p, SamplingParams(temperature=0.0, max_new_tokens=8,
                                                      stop_token_ids=(stop,))))
    assert list(g.token_ids) == greedy[:first + 1] and g.finish_reason == "stop"
    # rows of one batch stop independently: the other row runs to its own budget
    params_long = SamplingParams(temperature=0.0, max_new_tokens=8)
    params_stop = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop,))

    async def both():
        return await asyncio.gather(engine.generate(p, params_stop), engine.generate(p, params_long))

    short, long = asyncio.run(both())
    assert list(short.token_ids) == greedy[:first + 1] and list(long.token_ids) == greedy


def test_generate_n_samples_independently_in_one_batch(engine, tok, reference_model):
    p = prompts(tok)[0]
    before = len(engine.batch_sizes)
    gens = asyncio.run(engine.generate_n(p, SamplingParams(max_new_tokens=6), 4))
    assert len(gens) == 4 and engine.batch_sizes[before:] == [4]
    assert len({g.token_ids for g in gens}) > 1  # a near-uniform random model: samples differ
    for g in gens:
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, p, list(g.token_ids)),
                                           abs=2e-4)
    with pytest.raises(ValueError, match="n >= 1"):
        asyncio.run(engine.generate_n(p, SamplingParams(), 0))


def test_update_weights_from_a_state_dict_and_from_a_directory(tiny_model_dir, tok, tmp_path):
    other_dir = make_tiny_qwen(tmp_path / "other", seed=1, tokenizer=tok)
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(other_dir, dtype=torch.float32).eval()
    p = prompts(tok)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    eng = HFEngine(tiny_model_dir, seed=0)
    before = asyncio.run(eng.generate(p, greedy))
    expected = greedy_reference(other, p, 5)
    assert list(before.token_ids) != expected  # the two random models disagree

    asyncio.run(eng.update_weights(other.state_dict()))
    assert list(asyncio.run(eng.generate(p, greedy)).token_ids) == expected and eng.weight_version == 1

    eng2 = HFEngine(tiny_model_dir, seed=0)
    asyncio.run(eng2.update_weights(other_dir))
    g = asyncio.run(eng2.generate(p, greedy))
    assert list(g.token_ids) == expected
    assert g.logprobs == pytest.approx(teacher_forced_logprobs(other, p, expected), abs=2e-4)

    bad = {k: v for k, v in other.state_dict().items() if "layers.1." not in k}
    with pytest.raises(EngineError, match=r"missing \['model.layers.1"):
        asyncio.run(eng2.update_weights(bad))
    with pytest.raises(EngineError, match="not a checkpoint directory"):
        asyncio.run(eng2.update_weights(tmp_path / "nope"))
    asyncio.run(eng.close())
    asyncio.run(eng2.close())
    with pytest.raises(EngineError, match="closed"):
        asyncio.run(eng.generate(p, greedy))
