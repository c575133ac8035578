"""The agent loop with a model that is not Qwen: SmolLM2-135M-Instruct (llama, its own 49,152-id tokenizer,
a plain ChatML template with no `tools` block; imported by `swerl models import`). The tool specs reach it
in swerl's system-message block; trajectories are token-exact in its tokenizer (drift 0), reasoning and
action spans fall on the right tokens, and its real, mostly malformed, turns come back as observations."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from swerl.agent import ScriptedEngine, load_tokenizer, run_episode
from swerl.agent import tool_call_text as call
from swerl.agent.format import TOOL_CALL_FORMAT, format_help, tools_in_template
from swerl.agent.tools import tool_specs
from swerl.models.shipped import import_model
from swerl.structs import ChatMessage, EnvStart, EpisodeLimits, ParsedTurn, SamplingParams, Span, StepResult

pytestmark = pytest.mark.slow


class EchoEnv:
    """The SWE tools, no sandbox: a call is answered with what it asked; `submit` ends the episode."""

    action_format = TOOL_CALL_FORMAT

    def reset(self) -> EnvStart:
        return EnvStart(messages=(ChatMessage("user", "List the files in /testbed, then submit."),),
                        tools=tool_specs())

    def step(self, turn: ParsedTurn) -> StepResult:
        if turn.malformed or not turn.tool_calls:
            return StepResult(observation=f"{turn.error}\n{format_help(TOOL_CALL_FORMAT, tool_specs())}")
        c = turn.tool_calls[0]
        if c.name == "submit":
            return StepResult(observation="submitted", terminated=True, reason="submit", result="")
        return StepResult(observation=f"ran {c.name} {json.dumps(c.arguments)}")


@pytest.fixture(scope="module")
def smol():
    return import_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def tok(smol):
    return load_tokenizer(smol)


def test_scripted_turns_in_smollm2s_tokens_are_exact_and_spanned(tok):
    assert not tools_in_template(tok) and tok.eos_token == "<|im_end|>" and len(tok) == 49152
    script = ["I will list the files.\n" + call("bash", {"command": "ls /testbed"}),
              "Let me think about it without a call.",
              "Done.\n" + call("submit", {})]
    traj = asyncio.run(run_episode(EchoEnv(), ScriptedEngine(tok, script), tok))
    assert traj.terminated and traj.stop_reason == "submit" and traj.drift_tokens == 0
    assert (traj.num_turns, traj.num_tool_calls, traj.num_malformed) == (3, 2, 1)
    prompt = tok.decode(traj.token_ids[:traj.prompt_len])
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and '"name": "bash"' in prompt
    for turn, text in zip(traj.turns, script, strict=True):
        ids = traj.token_ids[turn.token_start:turn.token_end]
        spans = traj.span[turn.token_start:turn.token_end]
        assert all(traj.loss_mask[turn.token_start:turn.token_end])
        assert ids[-1] == tok.eos_token_id and tok.decode(ids[:-1]) == text  # the model's own tokens
        action = tok.decode([i for i, s in zip(ids, spans, strict=True) if s == Span.ACTION])
        reasoning = tok.decode([i for i, s in zip(ids, spans, strict=True) if s == Span.REASONING])
        if turn.malformed:
            assert action == "" and turn.observation.startswith(turn.error)
            assert "End your message with exactly one tool call" in turn.observation
        else:
            assert action.startswith("<tool_call>")
            assert action.removesuffix("<|im_end|>").endswith("</tool_call>")
            assert reasoning == text[:text.index("<tool_call>")]


class Recording:
    """The engine, with every prompt it got and every generation it returned."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    async def generate(self, prompt_ids, params):
        gen = await self.engine.generate(prompt_ids, params)
        self.calls.append((list(prompt_ids), gen))
        return gen


def test_smollm2_plays_an_episode_token_exact_through_the_hf_engine(smol, tok):
    """The real model's own turns (it seldom writes a well-formed call): whatever it writes is kept token
    for token (each turn's prompt is the trajectory so far, each turn the engine's own ids), a malformed
    turn gets the format help as its observation, and the episode goes on. A spelling the tokenizer would
    not produce (it happens at T = 1) is kept too, and marked as drift."""
    from swerl.rollout.hf import HFEngine

    engine = Recording(HFEngine(smol, seed=0))
    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    traj = asyncio.run(run_episode(EchoEnv(), engine, tok, params=params, limits=EpisodeLimits(max_turns=3)))
    asyncio.run(engine.engine.close())
    print([t.text for t in traj.turns])
    assert traj.num_turns >= 1 and len(engine.calls) == traj.num_turns
    assert traj.truncated or traj.terminated
    assert traj.drift_detected == (traj.drift_tokens > 0)
    for turn, (prompt, gen) in zip(traj.turns, engine.calls, strict=True):
        assert list(traj.token_ids[:turn.token_start]) == prompt
        assert traj.token_ids[turn.token_start:turn.token_end] == gen.token_ids
        assert traj.logprobs[turn.token_start:turn.token_end] == gen.logprobs
    for turn in traj.turns:
        gen = range(turn.token_start, turn.token_end)
        assert all(traj.loss_mask[i] == 1 for i in gen)
        assert all(math.isfinite(traj.logprobs[i]) and traj.logprobs[i] <= 0 for i in gen)
        if turn.finish_reason == "stop":
            assert traj.token_ids[turn.token_end - 1] == tok.eos_token_id
        if turn.malformed and turn.observation:
            assert "End your message with exactly one tool call" in turn.observation
    assert sum(traj.loss_mask) == sum(t.token_end - t.token_start for t in traj.turns)
