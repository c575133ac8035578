"""One multi-turn episode: env + engine → a token-exact `Trajectory`.

Token bookkeeping (the trajectory contract of docs/architecture.md):
- the prompt is rendered by the chat template (with the tool specs) and tokenised once;
- each model turn is appended exactly as the engine sampled it, never re-tokenised;
- each observation is wrapped in the template's tool-response frame (derived from the template,
  see `format.observation_frame`) and tokenised once;
- observation tokens are appended only when another generation follows, so a trajectory ends on
  the model's last turn;
- at the end `measure_drift` re-renders the whole conversation and compares; a mismatch is
  recorded (`drift_tokens`, `drift_first_index`, `drift_detected`), never silently trained on.

Ending rules:
- terminated: the env says so (`submit` → reason `submit`);
- truncated: `max_turns`, `max_context` (no room for another token, or an observation would not
  fit, or a turn was cut by the context room left), `wall_clock`, `max_new_tokens` (a turn cut by
  the per-turn limit ends the episode: its call may be incomplete, and continuing would need a
  non-model end-of-turn token; the cut turn's tokens stay in the trajectory and are trained on),
  `engine_abort`.
Malformed turns get an error observation and count in `num_malformed`; the episode goes on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

from swerl.agent.engine import Engine
from swerl.agent.env import Env
from swerl.agent.format import encode, measure_drift, observation_frame, parse_turn, render, token_char_spans
from swerl.agent.tokenizer import check_tool_template
from swerl.structs import (
    ChatMessage,
    EpisodeLimits,
    Generation,
    ParsedTurn,
    SamplingParams,
    Span,
    Trajectory,
    Turn,
)

# plain ints in the trajectory (what JSON and tensors hold), named by the one Span enum
_CONTEXT, _REASONING, _ACTION = int(Span.CONTEXT), int(Span.REASONING), int(Span.ACTION)


@dataclass
class _Seq:
    """The growing per-token arrays (private: the public result is the frozen Trajectory)."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    span: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)

    def context(self, ids: list[int]) -> None:
        n = len(ids)
        self.ids += ids
        self.mask += [0] * n
        self.span += [_CONTEXT] * n
        self.logp += [0.0] * n
        self.turn += [-1] * n

    def generated(self, ids: list[int], logp: list[float], spans: list[int], turn: int) -> None:
        n = len(ids)
        self.ids += ids
        self.mask += [1] * n
        self.span += spans
        self.logp += logp
        self.turn += [turn] * n


def token_spans(tok: Any, body_ids: list[int], parsed: ParsedTurn) -> list[int]:
    """Span label of each generated token (end-of-turn token excluded): action if its characters
    overlap an action block (a token straddling the boundary counts as action), else reasoning."""
    _, chars = token_char_spans(tok, body_ids)
    out = []
    for s, e in chars:
        hit = any(s < b and a < max(e, s + 1) for a, b in parsed.action_spans)
        out.append(_ACTION if hit else _REASONING)
    return out


def _check_generation(gen: Generation, params: SamplingParams) -> None:
    if not gen.token_ids and gen.finish_reason != "abort":
        raise RuntimeError(f"engine returned no tokens with finish_reason {gen.finish_reason!r}")
    if len(gen.token_ids) > params.max_new_tokens:
        raise RuntimeError(f"engine returned {len(gen.token_ids)} tokens, over "
                           f"max_new_tokens={params.max_new_tokens}")


async def run_episode(env: Env, engine: Engine, tokenizer: Any, *, params: SamplingParams | None = None,
                      limits: EpisodeLimits | None = None) -> Trajectory:
    """Run one episode to its end and return its token-exact trajectory. Exceptions only mean the
    harness failed (engine or sandbox broken); everything the model does is in the trajectory."""
    params = params or SamplingParams()
    limits = limits or EpisodeLimits()
    check_tool_template(tokenizer)
    t0 = time.monotonic()

    def time_left() -> float:
        return limits.wall_clock_s - (time.monotonic() - t0)

    start = await asyncio.to_thread(env.reset)
    fmt = env.action_format
    tools = start.tools
    if not start.messages:
        raise ValueError("env.reset() returned no messages: an episode needs at least a user message")
    conversation: list[ChatMessage] = list(start.messages)
    frame = observation_frame(tokenizer, start.messages, tools)
    eos = tokenizer.eos_token_id
    stop_ids = tuple(dict.fromkeys((*params.stop_token_ids, eos)))

    seq = _Seq()
    seq.context(encode(tokenizer, render(tokenizer, conversation, tools, add_generation_prompt=True)))
    prompt_len = len(seq.ids)
    turns: list[Turn] = []
    ends_with_context = True  # the sequence ends with a generation prompt (no model turn yet)
    terminated = truncated = False
    stop_reason = ""
    reward: float | None = None
    result: str | None = None
    n_calls = n_malformed = 0

    while True:
        k = len(turns)
        room = limits.max_context_tokens - len(seq.ids)
        if room <= 0:
            truncated, stop_reason = True, "max_context"
            break
        if time_left() <= 0:
            truncated, stop_reason = True, "wall_clock"
            break
        p = replace(params, max_new_tokens=min(params.max_new_tokens, room), stop_token_ids=stop_ids)
        try:
            gen = await asyncio.wait_for(engine.generate(list(seq.ids), p), timeout=time_left())
        except TimeoutError:
            truncated, stop_reason = True, "wall_clock"
            break
        _check_generation(gen, p)
        ids = list(gen.token_ids)
        # The end-of-turn token is not part of the text; other stop tokens (e.g. `</tool_call>`) are.
        ended = bool(ids) and ids[-1] == eos
        body = ids[:-1] if ended else ids
        text, _ = token_char_spans(tokenizer, body)
        parsed = parse_turn(text, fmt, tools)
        spans = token_spans(tokenizer, body, parsed)
        if ended:
            closes_action = bool(parsed.action_spans) and not text[parsed.action_spans[-1][1]:].strip()
            spans.append(_ACTION if closes_action else _REASONING)
        tok_start = len(seq.ids)
        seq.generated(ids, list(gen.logprobs), spans, k)
        ends_with_context = False
        conversation.append(ChatMessage("assistant", text))

        def record(observation: str = "", obs_tokens: int = 0, *, parsed: ParsedTurn = parsed,
                   gen: Generation = gen, text: str = text, tok_start: int = tok_start, k: int = k) -> None:
            turns.append(Turn(index=k, text=text, token_start=tok_start,
                              token_end=tok_start + len(gen.token_ids), finish_reason=gen.finish_reason,
                              tool_calls=parsed.tool_calls, malformed=parsed.malformed, error=parsed.error,
                              observation=observation, observation_tokens=obs_tokens,
                              weight_version=gen.weight_version))

        if gen.finish_reason == "abort":
            record()
            truncated, stop_reason = True, "engine_abort"
            break
        if gen.finish_reason == "length":
            record()
            truncated = True
            stop_reason = "max_context" if p.max_new_tokens < params.max_new_tokens else "max_new_tokens"
            break

        if parsed.malformed:
            n_malformed += 1
            observation = parsed.error
        else:
            n_calls += len(parsed.tool_calls)
            step = await asyncio.to_thread(env.step, parsed)
            observation = step.observation
            if step.reward is not None:
                reward = step.reward
            if step.terminated:
                record(observation)
                terminated, stop_reason, result = True, step.reason or "env_done", step.result
                break
        # Observation tokens only go in when another generation follows.
        if k + 1 >= limits.max_turns:
            record(observation)
            truncated, stop_reason = True, "max_turns"
            break
        if time_left() <= 0:
            record(observation)
            truncated, stop_reason = True, "wall_clock"
            break
        # A turn stopped by a custom stop token has no end-of-turn token yet: the template needs one
        # before the tool response. It is context (not sampled), so it is not trained on.
        obs_ids = ([] if ended else [eos]) + encode(tokenizer, frame.wrap(observation))
        if len(seq.ids) + len(obs_ids) >= limits.max_context_tokens:
            record(observation)
            truncated, stop_reason = True, "max_context"
            break
        seq.context(obs_ids)
        ends_with_context = True
        conversation.append(ChatMessage("tool", observation))
        record(observation, len(obs_ids))

    drift = measure_drift(tokenizer, conversation, tools, seq.ids,
                          ends_with_generation_prompt=ends_with_context)
    versions = tuple(t.weight_version for t in turns)
    return Trajectory(
        token_ids=tuple(seq.ids), loss_mask=tuple(seq.mask), span=tuple(seq.span), logprobs=tuple(seq.logp),
        turn_index=tuple(seq.turn), prompt_len=prompt_len, terminated=terminated, truncated=truncated,
        stop_reason=stop_reason, reward=reward, result=result, num_turns=len(turns), num_tool_calls=n_calls,
        num_malformed=n_malformed, wall_time_s=time.monotonic() - t0, drift_tokens=drift.tokens,
        drift_first_index=drift.first_index, drift_detected=drift.tokens > 0, turns=tuple(turns),
        turn_versions=versions if None not in versions else (),  # type: ignore[arg-type]
    )
