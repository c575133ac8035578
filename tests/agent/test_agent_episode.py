"""Whole episodes: a scripted policy (real Qwen tokenizer) drives the tools in a real DockerSandbox."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from swerl.agent import (
    ScriptedEngine,
    ToolEnv,
    load_tokenizer,
    measure_drift,
    run_episode,
    tool_call_text,
)
from swerl.agent.format import encode
from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.structs import ChatMessage, EpisodeLimits, SamplingParams, Span, Trajectory

pytestmark = pytest.mark.docker

CALC = "/testbed/calc/__init__.py"
TASK = "mean() in calc/__init__.py returns the wrong value. Fix it."


def turn(thought: str, name: str, **arguments) -> str:
    return f"<think>\n{thought}\n</think>\n\n" + tool_call_text(name, arguments)


FIX_SCRIPT = [
    turn("Let me read the code.", "str_replace_editor", command="view", path=CALC),
    turn("The divisor is off by one.", "str_replace_editor", command="str_replace", path=CALC,
         old_str="/ (len(values) + 1)", new_str="/ len(values)"),
    turn("Run the tests.", "bash", command="cd /testbed && python3 -m pytest -q 2>&1 | tail -2"),
    turn("All pass, submit.", "submit"),
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture
def box(task_image):
    with DockerSandbox(SandboxSpec(image=task_image, memory="512m")) as sb:
        yield sb


@pytest.fixture(scope="module")
def shared_box(task_image):
    """For episodes that never change the repository (malformed turns, limits)."""
    with DockerSandbox(SandboxSpec(image=task_image, memory="512m")) as sb:
        yield sb


def play(tok, sandbox, script, *, params=None, limits=None, env=None) -> Trajectory:
    env = env or ToolEnv(sandbox, TASK)
    return asyncio.run(run_episode(env, ScriptedEngine(tok, script), tok, params=params, limits=limits))


def test_scripted_agent_fixes_the_bug_and_the_trajectory_is_token_exact(tok, box):
    tr = play(tok, box, FIX_SCRIPT)
    assert tr.terminated and not tr.truncated and tr.stop_reason == "submit"
    assert tr.result is not None
    assert "-    return sum(values) / (len(values) + 1)\n+    return sum(values) / len(values)\n" in tr.result
    assert tr.result == box.diff()
    assert (tr.num_turns, tr.num_tool_calls, tr.num_malformed) == (4, 4, 0)
    assert "3 passed" in tr.turns[2].observation
    assert tr.turns[0].observation.splitlines()[11] == "    11\t    return sum(values) / (len(values) + 1)"
    assert tr.drift_tokens == 0 and tr.drift_first_index == -1 and not tr.drift_detected
    assert tr.reward is None and tr.wall_time_s > 0

    n = len(tr.token_ids)
    assert n == len(tr.loss_mask) == len(tr.span) == len(tr.logprobs) == len(tr.turn_index)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    # the prompt: system + tools + user, up to the generation prompt
    prompt = tok.decode(tr.token_ids[:tr.prompt_len], skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>system\n") and '"name": "str_replace_editor"' in prompt
    assert prompt.endswith(f"<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n")
    # exactly the generated tokens are masked 1, with their turn number; they decode to script + <|im_end|>
    masked = [i for i in range(n) if tr.loss_mask[i]]
    assert masked == [i for t in tr.turns for i in range(t.token_start, t.token_end)]
    for k, (t, text) in enumerate(zip(tr.turns, FIX_SCRIPT, strict=True)):
        ids = list(tr.token_ids[t.token_start:t.token_end])
        assert ids == [*encode(tok, text), im_end]
        assert tok.decode(ids, skip_special_tokens=False) == text + "<|im_end|>"
        assert t.text == text and set(tr.turn_index[t.token_start:t.token_end]) == {k}
    for i in range(n):
        if not tr.loss_mask[i]:
            assert (tr.span[i], tr.turn_index[i], tr.logprobs[i]) == (Span.CONTEXT, -1, 0.0)
    # observations sit between the turns, in the template's tool-response frame, tokenised once
    for a, b in itertools.pairwise(tr.turns):
        obs = tok.decode(tr.token_ids[a.token_end:b.token_start], skip_special_tokens=False)
        assert obs == (f"\n<|im_start|>user\n<tool_response>\n{a.observation}\n</tool_response><|im_end|>\n"
                       "<|im_start|>assistant\n")
        assert a.observation_tokens == b.token_start - a.token_end
    assert tr.turns[-1].token_end == n  # the trajectory ends on the model's last turn


def test_spans_mark_reasoning_and_action_tokens(tok, box):
    tr = play(tok, box, FIX_SCRIPT[-1:])
    t = tr.turns[0]
    text = FIX_SCRIPT[-1]
    call_start = text.index("<tool_call>")
    pieces = tok.convert_ids_to_tokens(list(tr.token_ids[t.token_start:t.token_end]))
    spans = tr.span[t.token_start:t.token_end]
    first_action = pieces.index("<tool_call>")
    assert set(spans[:first_action]) == {Span.REASONING}  # <think> … </think> and the blank line
    assert set(spans[first_action:]) == {Span.ACTION}  # <tool_call> … </tool_call> and <|im_end|>
    assert pieces[0] == "<think>" and "</think>" in pieces[:first_action]
    decoded_reasoning = tok.convert_tokens_to_string(pieces[:first_action])
    assert decoded_reasoning == text[:call_start]


def test_a_token_straddling_the_action_boundary_counts_as_action(tok):
    # "Done." + "<action>" style: in the tag format the tag is plain text, so BPE merges across it
    from swerl.agent import TAG_FORMAT
    from swerl.agent.episode import token_spans
    from swerl.agent.format import parse_turn

    text = "ok.<action>go north</action>"
    ids = encode(tok, text)
    parsed = parse_turn(text, TAG_FORMAT)
    spans = token_spans(tok, ids, parsed)
    pieces = tok.convert_ids_to_tokens(ids)
    straddler = next(i for i, p in enumerate(pieces) if p.startswith(".<"))  # '.<' holds both sides
    assert spans[straddler] == Span.ACTION and spans[0] == Span.REASONING
    assert set(spans[straddler:]) == {Span.ACTION}


MALFORMED = {
    "no_call": (turn("Thinking only.", "submit").split("<tool_call>")[0] + "I will look around.",
                "contained no tool call"),
    "invalid_json": ('<think>\nx\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n'
                     '</tool_call>',
                     "not valid JSON"),
    "unknown_tool": (turn("x", "python", code="print(1)"), "Unknown tool 'python'"),
    "wrong_type": (turn("x", "bash", command=["ls"]), "argument 'command' must be string"),
    "missing_arg": (turn("x", "str_replace_editor", command="view"), "missing required argument(s) ['path']"),
    "several_calls": (turn("x", "bash", command="ls") + "\n" + tool_call_text("submit"),
                      "contained 2 tool calls"),
    "text_after_call": (turn("x", "bash", command="ls") + "\nLet's see.", "text after the tool call"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_turn_gets_an_error_observation_and_the_episode_goes_on(tok, shared_box, kind):
    bad, says = MALFORMED[kind]
    tr = play(tok, shared_box, [bad, turn("Retry.", "submit")])
    assert tr.terminated and tr.stop_reason == "submit"
    assert (tr.num_turns, tr.num_malformed, tr.num_tool_calls) == (2, 1, 1)
    t = tr.turns[0]
    assert t.malformed and t.tool_calls == () and says in t.error and t.observation == t.error
    assert ('<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}\n'
            '</tool_call>') in t.error
    obs = tok.decode(tr.token_ids[t.token_end:tr.turns[1].token_start], skip_special_tokens=False)
    assert f"<tool_response>\n{t.error}\n</tool_response>" in obs
    assert not tr.drift_detected


def test_max_turns_truncates(tok, shared_box):
    look = turn("Look.", "bash", command="ls")
    tr = play(tok, shared_box, [look] * 3, limits=EpisodeLimits(max_turns=2))
    assert tr.truncated and not tr.terminated and tr.stop_reason == "max_turns" and tr.num_turns == 2
    assert tr.turns[-1].observation == "README.md\ncalc\ntests" and tr.turns[-1].observation_tokens == 0
    assert tr.turns[-1].token_end == len(tr.token_ids) and not tr.drift_detected


def test_max_context_truncates_when_an_observation_would_not_fit(tok, shared_box):
    look = turn("Look.", "str_replace_editor", command="view", path=CALC)
    first = play(tok, shared_box, [look, turn("Done.", "submit")])
    end_of_turn_1 = first.turns[0].token_end
    tr = play(tok, shared_box, [look, look], limits=EpisodeLimits(max_context_tokens=end_of_turn_1 + 20))
    assert tr.truncated and tr.stop_reason == "max_context" and tr.num_turns == 1
    assert len(tr.token_ids) == end_of_turn_1 and "cat -n" in tr.turns[0].observation


def test_max_context_cuts_a_turn_and_truncates(tok, shared_box):
    first = play(tok, shared_box, [turn("Done.", "submit")])
    tr = play(tok, shared_box, [turn("Done.", "submit")],
              limits=EpisodeLimits(max_context_tokens=first.prompt_len + 5))
    assert tr.truncated and tr.stop_reason == "max_context"
    assert len(tr.token_ids) == first.prompt_len + 5 and sum(tr.loss_mask) == 5
    assert tr.turns[0].finish_reason == "length"


def test_max_new_tokens_keeps_the_cut_turn_and_truncates(tok, shared_box):
    tr = play(tok, shared_box, FIX_SCRIPT, params=SamplingParams(max_new_tokens=10))
    assert tr.truncated and tr.stop_reason == "max_new_tokens" and tr.num_turns == 1
    t = tr.turns[0]
    assert t.finish_reason == "length" and t.token_end - t.token_start == 10 == sum(tr.loss_mask)
    assert FIX_SCRIPT[0].startswith(t.text) and t.malformed and t.observation == ""
    assert not tr.drift_detected


def test_wall_clock_truncates(tok, shared_box):
    slow = turn("Wait.", "bash", command="sleep 2")
    tr = play(tok, shared_box, [slow, slow], limits=EpisodeLimits(wall_clock_s=1.0))
    assert tr.truncated and tr.stop_reason == "wall_clock" and tr.num_turns == 1
    assert tr.wall_time_s >= 1.0


def test_drift_check_catches_a_template_that_rerenders_history_differently(tok, shared_box):
    # Like Qwen3's templates before a new user query: earlier turns lose their reasoning when re-rendered.
    strips = load_tokenizer()
    strips.chat_template = tok.chat_template.replace("{%- if loop.index0 > ns.last_query_index %}",
                                                     "{%- if loop.last %}")
    assert strips.chat_template != tok.chat_template
    look = turn("Look.", "bash", command="ls")
    tr = play(strips, shared_box, [look, turn("Done.", "submit")])
    assert tr.drift_detected and tr.drift_tokens > 0
    assert tr.drift_first_index == tr.turns[0].token_start  # where <think> was dropped
    assert tr.terminated  # the episode itself is fine; the learner decides to drop it


def test_drift_check_catches_a_tampered_token(tok, box):
    tr = play(tok, box, FIX_SCRIPT)
    assert tr.drift_tokens == 0
    env_msgs = [ChatMessage("system", ToolEnv(box, TASK).system_prompt), ChatMessage("user", TASK)]
    conv = list(env_msgs)
    for t in tr.turns:
        conv.append(ChatMessage("assistant", t.text))
        if t.observation_tokens:
            conv.append(ChatMessage("tool", t.observation))
    from swerl.agent import tool_specs

    assert measure_drift(tok, conv, tool_specs(), tr.token_ids).tokens == 0
    tampered = list(tr.token_ids)
    i = tr.turns[1].token_start + 3
    tampered[i] = tok.convert_tokens_to_ids("Ġhello")
    d = measure_drift(tok, conv, tool_specs(), tampered)
    assert (d.tokens, d.first_index) == (1, i)


def test_custom_stop_token_gets_an_end_of_turn_added_as_context(tok, shared_box):
    close = tok.convert_tokens_to_ids("</tool_call>")
    tr = play(tok, shared_box, [turn("Look.", "bash", command="ls"), turn("Done.", "submit")],
              params=SamplingParams(stop_token_ids=(close,)))
    t0 = tr.turns[0]
    assert tr.token_ids[t0.token_end - 1] == close and t0.text.endswith("</tool_call>")
    assert tr.token_ids[t0.token_end] == tok.eos_token_id and tr.loss_mask[t0.token_end] == 0
    assert not tr.drift_detected and tr.terminated


def test_engine_running_out_of_script_is_a_clear_error(tok, shared_box):
    with pytest.raises(RuntimeError,
                       match="ScriptedEngine ran out of script: turn 2 requested, only 1 scripted"):
        play(tok, shared_box, [turn("Look.", "bash", command="ls")])


def test_trajectory_json_round_trip(tok, shared_box):
    tr = play(tok, shared_box, [turn("Look.", "bash", command="ls"), turn("Done.", "submit")])
    again = Trajectory.from_json(tr.to_json())
    assert again == tr
    assert json.loads(tr.to_json())["turns"][0]["tool_calls"][0]["name"] == "bash"


def test_no_drift_when_the_model_does_not_think(tok, shared_box):
    # Qwen3's template prepends an empty <think> block to a conversation's final assistant message;
    # the check renders the last turn as history, as the model saw it, so this is not drift.
    tr = play(tok, shared_box, [tool_call_text("bash", {"command": "ls"}), tool_call_text("submit")])
    assert tr.terminated and tr.drift_tokens == 0 and not tr.drift_detected
    assert set(tr.span[tr.turns[1].token_start:tr.turns[1].token_end]) == {Span.ACTION}


class _SlowEngine:
    """A real Engine implementation whose every generation takes `delay` seconds (a stalled server)."""

    def __init__(self, inner: ScriptedEngine, delay: float) -> None:
        self.inner, self.delay = inner, delay

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(self.delay)
        return await self.inner.generate(prompt_ids, params)


class _AbortingEngine:
    """An Engine whose server gives up on the request."""

    async def generate(self, prompt_ids, params):
        from swerl.structs import Generation

        return Generation(token_ids=(), logprobs=(), finish_reason="abort")


def test_a_stalled_generation_is_cut_by_the_wall_clock(tok, shared_box):
    from swerl.agent import Engine, Env

    engine = _SlowEngine(ScriptedEngine(tok, [turn("Done.", "submit")]), delay=5.0)
    env = ToolEnv(shared_box, TASK)
    assert isinstance(engine, Engine) and isinstance(env, Env)
    tr = asyncio.run(run_episode(env, engine, tok, limits=EpisodeLimits(wall_clock_s=0.5)))
    assert tr.truncated and tr.stop_reason == "wall_clock" and tr.num_turns == 0
    assert len(tr.token_ids) == tr.prompt_len and tr.wall_time_s < 3


def test_an_engine_abort_truncates(tok, shared_box):
    tr = asyncio.run(run_episode(ToolEnv(shared_box, TASK), _AbortingEngine(), tok))
    assert tr.truncated and tr.stop_reason == "engine_abort" and tr.num_turns == 1
    assert tr.turns[0].finish_reason == "abort" and sum(tr.loss_mask) == 0
