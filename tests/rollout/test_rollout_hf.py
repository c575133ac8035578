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


def test_the_next_turn_prefills_only_its_new_tokens_and_its_logprobs_match_teacher_forcing(
        tiny_model_dir, tok, reference_model):
    """The prefix cache: turn 2 of three episodes (and a fresh prompt in the same batch) prefills the
    observation only, rows with cached prefixes of different lengths side by side, and every row's
    logprobs are still those of one unpadded pass over the whole conversation."""
    eng = HFEngine(tiny_model_dir, seed=0, prefix_cache_mb=64)
    ps = prompts(tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)

    async def turn(prompts_):
        return await asyncio.gather(*(eng.generate(p, params) for p in prompts_))

    first = asyncio.run(turn(ps))
    assert len(eng.prefix_cache) == 3 and eng.cached_tokens == 0
    obs = tok("\nObservation: the tests pass.\n")["input_ids"]
    second_prompts = [p + list(g.token_ids) + obs for p, g in zip(ps, first, strict=True)]
    fresh = tok("A prompt nobody has seen")["input_ids"]
    prefilled = eng.prefill_tokens
    second = asyncio.run(turn([*second_prompts, fresh]))
    # cached: each prompt and its generated tokens but the last, which was sampled and never fed
    assert eng.cached_tokens == sum(len(p) + 12 - 1 for p in ps)
    assert eng.prefill_tokens - prefilled == 3 * (1 + len(obs)) + len(fresh)
    for p, g in zip([*second_prompts, fresh], second, strict=True):
        expected = teacher_forced_logprobs(reference_model, p, list(g.token_ids))
        assert g.logprobs == pytest.approx(expected, abs=3e-4)  # see rollout_helpers

    # generate_n from a cached prompt: every row starts from the one entry
    third = second_prompts[0] + list(second[0].token_ids) + obs
    cached = eng.cached_tokens
    gens = asyncio.run(eng.generate_n(third, params, 3))
    assert eng.cached_tokens - cached == 3 * (len(second_prompts[0]) + 12 - 1)
    for g in gens:
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, third, list(g.token_ids)),
                                           abs=3e-4)
    # new weights: every entry is stale
    asyncio.run(eng.update_weights(reference_model.state_dict()))
    assert len(eng.prefix_cache) == 0
    asyncio.run(eng.close())
    with pytest.raises(ValueError, match="prefix_cache_mb must be >= 0"):
        HFEngine(tiny_model_dir, prefix_cache_mb=-1)
    with pytest.raises(ValueError, match="kv_headroom must be >= 0"):
        HFEngine(tiny_model_dir, kv_headroom=-1)


def test_a_request_joins_the_running_batch_and_an_early_row_does_not_wait_for_the_longest(
        tiny_model_dir, tok, reference_model):
    """Continuous batching: the short turn's caller gets its result while the long row still decodes,
    its next turn (a prefix-cache hit, so the two rows' caches differ in width) joins that same batch,
    and both rows' logprobs are still those of one unpadded pass."""
    eng = HFEngine(tiny_model_dir, seed=0, prefix_cache_mb=64, continuous=True)
    long_p, short_p = prompts(tok)[1], prompts(tok)[0]
    obs = tok("\nObservation: done.\n")["input_ids"]
    order: list[str] = []
    before = len(eng.batch_sizes)

    async def long_turn():
        g = await eng.generate(long_p, SamplingParams(max_new_tokens=200))
        order.append("long")
        return g

    async def episode():
        first = await eng.generate(short_p, SamplingParams(max_new_tokens=2))
        order.append("short")
        follow = short_p + list(first.token_ids) + obs
        second = await eng.generate(follow, SamplingParams(max_new_tokens=8))
        order.append("follow-up")
        return follow, second

    async def both():
        return await asyncio.gather(long_turn(), episode())

    long_g, (follow, second) = asyncio.run(both())
    assert order == ["short", "follow-up", "long"]
    assert eng.batch_sizes[before:] == [2] and eng.joined == 1  # the follow-up ran inside the first batch
    assert eng.cached_tokens == len(short_p) + 1
    assert second.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, follow,
                                                                    list(second.token_ids)), abs=3e-4)
    assert long_g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, long_p,
                                                                    list(long_g.token_ids)), abs=3e-4)
    asyncio.run(eng.close())


def test_a_weight_update_is_not_starved_by_requests_that_keep_joining(tiny_model_dir, tok, reference_model):
    """Two episodes' turns overlap without a gap, so the running batch always has a joiner; a weight
    update still waits only for the rows already in the batch."""
    eng = HFEngine(tiny_model_dir, seed=0, continuous=True)
    p = prompts(tok)[0]

    async def go():
        update: asyncio.Future | None = None

        async def chain(offset: float) -> int:
            await asyncio.sleep(offset)
            turns = 0
            while (update is None or not update.done()) and turns < 300:
                await eng.generate(p, SamplingParams(max_new_tokens=12))
                turns += 1
            return turns

        chains = [asyncio.ensure_future(chain(0)), asyncio.ensure_future(chain(0.02))]
        await asyncio.sleep(0.3)
        joined = eng.joined
        update = asyncio.ensure_future(eng.update_weights(reference_model.state_dict()))
        await asyncio.wait_for(update, 120)
        return joined, await asyncio.gather(*chains)

    joined, turns = asyncio.run(go())
    assert joined > 0  # the turns were joining the running batch when the update came
    assert eng.weight_version == 1 and max(turns) < 300
    asyncio.run(eng.close())


def test_when_the_longest_prompt_leaves_the_rows_left_keep_their_logprobs(tiny_model_dir, tok,
                                                                          reference_model, monkeypatch):
    """The padding only a departed row needed is cut from the cache; the rows left decode on unchanged."""
    eng = HFEngine(tiny_model_dir, seed=0)
    ps = prompts(tok)
    widths: list[int] = []
    step = HFEngine._step
    monkeypatch.setattr(HFEngine, "_step", lambda self, rows, tok_: widths.append(rows.mask.shape[1]) or
                        step(self, rows, tok_))

    async def go():
        return await asyncio.gather(eng.generate(ps[1], SamplingParams(max_new_tokens=1)),
                                    eng.generate(ps[0], SamplingParams(max_new_tokens=10)))

    _, g = asyncio.run(go())
    assert len(ps[1]) > len(ps[0]) and widths[0] == len(ps[0])  # the long prompt's padding went with it
    assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, ps[0], list(g.token_ids)),
                                       abs=2e-4)
    asyncio.run(eng.close())


def test_what_a_request_samples_does_not_depend_on_its_batch(tiny_model_dir, tok):
    """Continuous batching: each request draws from its own stream (engine seed, prompt, how often it
    was asked): alone or behind two others in one batch, with the same seed it samples the same tokens;
    asked twice, it samples anew."""
    ps = prompts(tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    alone = HFEngine(tiny_model_dir, seed=5, continuous=True)
    crowded = HFEngine(tiny_model_dir, seed=5, continuous=True)

    async def one():
        return await alone.generate(ps[0], params)

    async def three():
        return await asyncio.gather(crowded.generate(ps[1], params), crowded.generate(ps[2], params),
                                    crowded.generate(ps[0], params))

    a = asyncio.run(one())
    *_, c = asyncio.run(three())
    assert crowded.batch_sizes == [3] and a.token_ids == c.token_ids
    again = asyncio.run(one())
    assert again.token_ids != a.token_ids  # a second request for the prompt is a new sample
    asyncio.run(alone.close())
    asyncio.run(crowded.close())


def test_the_hf_engine_releases_when_it_has_nothing_left_to_decode(tiny_model_dir, tok, monkeypatch):
    """The decode caches' pages go back to the OS between batches (swerl.heap), not only at exit."""
    from swerl.rollout import hf

    calls = []
    monkeypatch.setattr(hf, "release_free_memory", lambda: calls.append(1) or True)
    engine = HFEngine(tiny_model_dir, seed=0)
    asyncio.run(engine.generate(tok("x")["input_ids"], SamplingParams(temperature=1.0, max_new_tokens=3)))
    asyncio.run(engine.close())
    assert calls
