"""The Engine contract on a real pretrained model: SmolLM2-135M-Instruct (llama, 30 layers, its own 49,152-id
tokenizer and ChatML template; `swerl models import smollm2-135m-instruct`), served by every engine — hf in
process, the strict SGLang double, the real vLLM CPU server (float32; marked ``vllm``) — against references
computed without any engine (plain transformers passes, and the learner's own log-prob code):

- a greedy turn is the model's own argmax path (an independent fp32 greedy decode, over the steps whose
  top-2 logit gap is at least `MARGIN_TAU`, `engine_reference.comparable_prefix`), and with the
  end-of-turn token as stop id it ends there, `stop`;
- sampled log-probs agree with the learner's recomputed ones (the mismatch KL of tests/contract/
  test_engine.py: max |d|, k1, k3) within `TOL_REAL`;
- generate_n gives n samples of exactly max_new_tokens, each with its teacher-forced log-probs.

`TOL_REAL`. The random checkpoint's 2e-4 (test_engine.py) bounds one fp32 output layer over H = 128; here
the logits come out of 30 layers of H = 576, and two fp32 passes that differ in summation order (KV
cache and left padding against one unpadded pass; other kernels in vLLM) drift apart layer by layer.
By the probabilistic bound used there (Higham & Mary: a dot product of n fp32 terms is off by
≤ λ·√n·2⁻²⁴ of the sum of |terms|, λ = 7), one H = 576 projection is off by ≤ 7·24·6e-8 ≈ 1e-5
relative, an MLP's 1536-term one by ≤ 1.6e-5; compounded over 30 residual layers (≤ 4 such products
each, the errors adding up: ≤ 30·4·1.6e-5 ≈ 2e-3 of a logit's scale) and times the logits' scale
(|logit| ≲ 30 for this model), a log-prob may move by ≲ 5e-2 in the worst case this bound allows;
measured (scripts/engine_mismatch.py --model smollm2-135m-instruct, 2,048 sampled tokens per engine,
bench_out/engine_mismatch_smollm2-135m-instruct.json) it moves by at most 3.1e-5 (hf), 4.3e-5 (vLLM),
2.7e-5 (SGLang double; vLLM eager as the suite runs it). `TOL_REAL` = 1e-2 sits between the two: it
holds by more than two orders of magnitude over the measurement, whatever the CPU vendor's kernels sum
in, and a wrong weight, position or template (a log-prob off by ≥ 0.1 on such a peaked model) still
fails it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contract.engine_reference import (
    MARGIN_TAU,
    REAL_LOGPROB_TOL,
    chat_prompt,
    comparable_prefix,
    greedy_with_margins,
    learner_logprobs,
    load_fp32,
    mismatch,
    open_engine,
    teacher_forced,
)

NAME = "smollm2-135m-instruct"
TOL_REAL = REAL_LOGPROB_TOL
STEPS = 24
MESSAGE = "What is 2+2?"  # its greedy answer ends with <|im_end|> within STEPS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    from swerl.models.shipped import import_model

    return import_model(NAME)


@pytest.fixture(scope="module")
def smol_tok(smol):
    from swerl.agent import load_tokenizer

    return load_tokenizer(smol)


@pytest.fixture(scope="module")
def smol_ref(smol, smol_tok):
    model = load_fp32(smol)
    prompt = chat_prompt(smol_tok, MESSAGE)
    greedy, margins = greedy_with_margins(model, prompt, STEPS)
    eot = smol_tok.eos_token_id
    assert eot in greedy, "the reference answer must end its turn within STEPS"
    end = greedy.index(eot) + 1
    assert comparable_prefix(margins) >= end, (margins, MARGIN_TAU)  # its whole answer is comparable
    return {"model": model, "prompt": prompt, "answer": greedy[:end], "eot": eot}


@pytest.fixture(scope="module", params=[
    "hf", pytest.param("vllm", marks=(pytest.mark.vllm,)), "sglang"])
def smol_engine(request, smol, smol_tok, tmp_path_factory):
    cm = open_engine(request.param, smol, smol_tok, log_dir=tmp_path_factory.mktemp(f"smol-{request.param}"))
    try:
        eng = cm.__enter__()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    try:
        yield request.param, eng
    finally:
        cm.__exit__(None, None, None)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def params(**kw: Any) -> Any:
    from swerl.structs import SamplingParams

    return SamplingParams(**kw)


def test_a_greedy_turn_is_the_models_answer_and_ends_at_its_end_of_turn(smol_engine, smol_ref):
    _, eng = smol_engine
    g = run(eng.generate(smol_ref["prompt"], params(temperature=0.0, max_new_tokens=STEPS,
                                                   stop_token_ids=(smol_ref["eot"],))))
    assert list(g.token_ids) == smol_ref["answer"] and g.finish_reason == "stop"
    want = teacher_forced(smol_ref["model"], smol_ref["prompt"], g.token_ids)
    assert list(g.logprobs) == pytest.approx(want, abs=TOL_REAL)


def test_sampled_logprobs_agree_with_the_learner(smol_engine, smol_ref, smol_tok):
    kind, eng = smol_engine
    gens = run(eng.generate_n(smol_ref["prompt"], params(temperature=1.0, max_new_tokens=STEPS), 8))
    assert [len(g.token_ids) for g in gens] == [STEPS] * 8  # no stop ids: sampled on past <|im_end|>
    eng_lp, lrn_lp = learner_logprobs(smol_ref["model"], smol_ref["prompt"], gens,
                                      pad_id=smol_tok.pad_token_id)
    m = mismatch(eng_lp, lrn_lp)
    print(kind, m)
    assert m["max_abs"] <= TOL_REAL and abs(m["k1"]) <= TOL_REAL and 0 <= m["k3"] <= TOL_REAL ** 2, m


def test_generate_n_gives_n_samples_of_exactly_max_new_tokens(smol_engine, smol_ref):
    _, eng = smol_engine
    gens = run(eng.generate_n(smol_ref["prompt"], params(temperature=1.0, max_new_tokens=6), 4))
    assert len(gens) == 4
    for g in gens:
        assert len(g.token_ids) == 6 == len(g.logprobs) and g.finish_reason == "length"
        assert all(0 <= t < 49152 for t in g.token_ids)
        assert list(g.logprobs) == pytest.approx(teacher_forced(smol_ref["model"], smol_ref["prompt"],
                                                                g.token_ids), abs=TOL_REAL)
