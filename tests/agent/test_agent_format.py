"""Parsing model turns, token offsets, template rendering, the tokenizer loader and the agent structs."""

from __future__ import annotations

import itertools
import json

import pytest

from swerl.agent import (
    TAG_FORMAT,
    format_help,
    load_tokenizer,
    measure_drift,
    observation_frame,
    parse_turn,
    render,
    token_char_spans,
    tool_call_text,
    tool_specs,
)
from swerl.agent.format import encode
from swerl.structs import (
    ChatMessage,
    Generation,
    SamplingParams,
    ToolCall,
    ToolSpec,
    Trajectory,
    Turn,
)

TOOLS = tool_specs()
THINK = "<think>\nI should look at the file.\n</think>\n\n"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_well_formed_call_gives_reasoning_call_and_span():
    call = tool_call_text("bash", {"command": "ls -la"})
    text = THINK + call
    p = parse_turn(text, tools=TOOLS)
    assert not p.malformed
    assert p.reasoning == "I should look at the file."
    assert p.tool_calls == (ToolCall("bash", '{"command": "ls -la"}'),)
    assert p.tool_calls[0].arguments == {"command": "ls -la"}
    (s, e), = p.action_spans
    assert text[s:e] == call and e == len(text)


def test_call_inside_reasoning_is_not_made():
    text = ("<think>\nmaybe " + tool_call_text("submit") + "\n</think>\n\n"
            + tool_call_text("bash", {"command": "ls"}))
    p = parse_turn(text, tools=TOOLS)
    assert [c.name for c in p.tool_calls] == ["bash"]
    assert len(p.action_spans) == 1


def test_arguments_given_as_json_string_are_accepted():
    text = '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}\n</tool_call>'
    assert parse_turn(text, tools=TOOLS).tool_calls[0].arguments == {"command": "pwd"}


# Malformed turns: one per kind, each message saying what was wrong and showing the format.
EXPECTED_FORMAT = ('<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}\n'
                   '</tool_call>')


@pytest.mark.parametrize(("text", "says"), [
    (THINK + "I will now run ls.", "contained no tool call"),
    (THINK + '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>', "not valid JSON"),
    (THINK + "<tool_call>\n{'name': 'bash'}\n</tool_call>", "not valid JSON"),
    (THINK + tool_call_text("python", {"code": "1"}),
     "Unknown tool 'python'. Available tools: bash, str_replace_editor, submit"),
    (THINK + tool_call_text("bash", {"command": 5}), "argument 'command' must be string, got 5"),
    (THINK + tool_call_text("bash", {}), "missing required argument(s) ['command']"),
    (THINK + tool_call_text("bash", {"command": "ls", "cwd": "/"}), "unknown argument(s) ['cwd']"),
    (THINK
     + tool_call_text("str_replace_editor", {"command": "view", "path": "/testbed", "view_range": [1, "2"]}),
     "argument 'view_range' must be array of integer"),
    (THINK + tool_call_text("str_replace_editor", {"command": "delete", "path": "/testbed/x"}),
     "argument 'command' must be one of ['view', 'create', 'str_replace', 'insert', 'undo_edit']"),
    (THINK + tool_call_text("bash", {"command": "ls"}) + "\n" + tool_call_text("submit"),
     "contained 2 tool calls; only 1"),
    (THINK + tool_call_text("bash", {"command": "ls"}) + "\nThe output will show the files.",
     "text after the tool call"),
    (THINK + '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', "<tool_call> is never closed"),
    ("<think>\nI am still thinking", "never closed with </think>"),
    (THINK + '<tool_call>\n["bash"]\n</tool_call>', "must be a JSON object"),
    (THINK + '<tool_call>\n{"arguments": {}}\n</tool_call>', 'has no "name"'),
])
def test_malformed_turn_says_what_was_wrong_and_shows_the_format(text, says):
    p = parse_turn(text, tools=TOOLS)
    assert p.malformed and p.tool_calls == ()
    assert says in p.error, p.error
    assert EXPECTED_FORMAT in p.error and "Available tools: bash, str_replace_editor, submit." in p.error


def test_bool_is_not_an_integer():
    text = tool_call_text("bash", {"command": "ls", "timeout": True})
    assert "argument 'timeout' must be integer" in parse_turn(text, tools=TOOLS).error


def test_tag_format_for_text_games():
    text = "<think>\nThe key is in the drawer.\n</think>\n<action>open drawer 1</action>"
    p = parse_turn(text, TAG_FORMAT)
    assert p.tool_calls == (ToolCall("action", '{"content": "open drawer 1"}'),)
    (s, e), = p.action_spans
    assert text[s:e] == "<action>open drawer 1</action>"
    assert parse_turn("<answer>B</answer>", TAG_FORMAT).tool_calls[0].arguments == {"content": "B"}
    bad = parse_turn("<action>go north</action><action>go south</action>", TAG_FORMAT)
    assert "contained 2 actions" in bad.error and "<action>…</action> or <answer>…</answer>" in bad.error
    assert "contained no action" in parse_turn("I go north.", TAG_FORMAT).error
    assert format_help(TAG_FORMAT).startswith("End your message with exactly one <action>")


def test_token_char_spans_cover_the_text_including_split_multibyte_characters(tok):
    text = "<think>\nhé 🫠 ok ✓✓\n</think>\n\n" + tool_call_text("bash", {"command": "echo ünï"})
    ids = encode(tok, text)
    decoded, spans = token_char_spans(tok, ids)
    assert decoded == text == tok.decode(ids, skip_special_tokens=False)
    assert spans[0] == (0, len("<think>")) and spans[-1] == (len(text) - len("</tool_call>"), len(text))
    # spans are contiguous except where several tokens share one multi-byte character
    for (a, b), (c, _) in itertools.pairwise(spans):
        assert c in (b, b - 1) and a < b
    emoji = text.index("🫠")
    assert sum(1 for s, e in spans if s <= emoji < e) == 3  # 🫠 is split over three byte tokens


def test_observation_frame_is_derived_from_the_template(tok):
    msgs = [ChatMessage("system", "S"), ChatMessage("user", "U")]
    frame = observation_frame(tok, msgs, TOOLS)
    assert frame.prefix == "\n<|im_start|>user\n<tool_response>\n"
    assert frame.suffix == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_observation_frame_rejects_a_template_without_tool_role(tok):
    other = load_tokenizer()
    other.chat_template = ("{% for m in messages %}{% if m.role != 'tool' %}<|im_start|>{{ m.role }}\n"
                           "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}{{ tools }}")
    with pytest.raises(RuntimeError, match="cannot derive the tool-response format"):
        observation_frame(other, [ChatMessage("user", "U")], TOOLS)


def test_render_includes_tool_specs_in_openai_format(tok):
    text = render(tok, [ChatMessage("system", "S"), ChatMessage("user", "U")], TOOLS,
                  add_generation_prompt=True)
    assert '{"type": "function", "function": {"name": "bash"' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_measure_drift_counts_differences(tok):
    msgs = [ChatMessage("user", "U"), ChatMessage("assistant", THINK + tool_call_text("submit"))]
    ids = encode(tok, render(tok, msgs, TOOLS, add_generation_prompt=False))
    ids = ids[:-1]  # the trajectory stops at <|im_end|>; the template's trailing newline is not drift
    assert measure_drift(tok, msgs, TOOLS, ids).tokens == 0
    bad = list(ids)
    bad[7] += 1
    d = measure_drift(tok, msgs, TOOLS, bad)
    assert (d.tokens, d.first_index) == (1, 7)
    d = measure_drift(tok, msgs, TOOLS, [*ids, 1, 2, 3])
    assert (d.tokens, d.first_index) == (3, len(ids))  # position len(ids) differs, then 2 extra tokens


def test_load_tokenizer_default_is_qwen_with_tools(tok):
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657


def test_load_tokenizer_errors_say_what_was_tried(tmp_path):
    with pytest.raises(RuntimeError, match="tokenizer directory '/nonexistent/tok' does not exist"):
        load_tokenizer("/nonexistent/tok")
    with pytest.raises(RuntimeError, match=f"could not load a tokenizer from '{tmp_path}' as a directory"):
        load_tokenizer(tmp_path)


SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""SmolLM2-135M-Instruct's chat template (its GGUF file's `tokenizer.chat_template`): ChatML with no `tools`
block and no special case for any role."""


def _with_template(tmp_path, template):
    from transformers import AutoTokenizer

    from swerl.agent import default_tokenizer_dir

    plain = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    plain.chat_template = template
    plain.save_pretrained(tmp_path)
    return tmp_path


def test_load_tokenizer_rejects_a_template_that_cannot_render_the_conversation(tmp_path):
    # contents only: no roles, no end-of-turn token after the assistant's turn
    with pytest.raises(RuntimeError, match="cannot derive the tool-response format from the chat template"):
        load_tokenizer(_with_template(tmp_path / "a", "{% for m in messages %}{{ m.content }}{% endfor %}"))
    # a template that leaves tool messages out
    drops = ("{% for m in messages %}{% if m.role != 'tool' %}<|im_start|>{{ m.content }}<|im_end|>"
             "{% endif %}{% endfor %}")
    with pytest.raises(RuntimeError, match="drops `tool` messages"):
        load_tokenizer(_with_template(tmp_path / "b", drops))
    raises = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
              "{% endfor %}")
    with pytest.raises(RuntimeError, match="cannot render a `tool` message"):
        load_tokenizer(_with_template(tmp_path / "c", raises))


def test_a_template_without_tools_gets_them_in_the_system_message(tmp_path):
    """SmolLM2's template has no `tools` block: swerl writes the schemas and the call format into the
    system message (replacing the template's default one), and a call written that way parses."""
    from swerl.agent.format import TOOL_PROMPT, tools_in_template, with_tool_prompt
    from swerl.agent.tools import tool_specs

    TOOL_SPECS = tool_specs()

    smol = load_tokenizer(_with_template(tmp_path, SMOL_TEMPLATE))
    assert not tools_in_template(smol) and tools_in_template(load_tokenizer())
    msgs = [ChatMessage("user", "fix the bug")]
    text = render(smol, msgs, TOOL_SPECS, add_generation_prompt=True)
    system = with_tool_prompt(msgs, TOOL_SPECS)[0].content
    assert system.startswith("# Tools") and TOOL_PROMPT.splitlines()[2] in system
    assert text == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nfix the bug<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    for spec in TOOL_SPECS:
        assert json.dumps(spec.to_openai(), ensure_ascii=False) in text
    # a system message of the env's own keeps its text, the tool block after it
    own = render(smol, [ChatMessage("system", "Be brief."), *msgs], TOOL_SPECS, add_generation_prompt=False)
    assert own.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert render(smol, msgs, (), add_generation_prompt=False).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # no tools: the template's own


def test_structs_validate_and_round_trip():
    with pytest.raises(ValueError, match="loss_mask has 1 entries, token_ids has 2"):
        Trajectory(token_ids=(1, 2), loss_mask=(0,), span=(0, 0), logprobs=(0.0, 0.0), turn_index=(-1, -1),
                   prompt_len=2, terminated=True, truncated=False, stop_reason="submit")
    with pytest.raises(ValueError, match="both terminated and truncated"):
        Trajectory(token_ids=(), loss_mask=(), span=(), logprobs=(), turn_index=(), prompt_len=0,
                   terminated=True, truncated=True, stop_reason="x")
    with pytest.raises(ValueError, match="finish_reason"):
        Generation(token_ids=(1,), logprobs=(0.0,), finish_reason="eos")
    with pytest.raises(ValueError, match="2 token_ids but 1 logprobs"):
        Generation(token_ids=(1, 2), logprobs=(0.0,), finish_reason="stop")
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="JSON object schema"):
        ToolSpec("x", "d", json.dumps({"type": "array"}))
    t = Trajectory(token_ids=(5, 6, 7), loss_mask=(0, 1, 1), span=(0, 1, 2), logprobs=(0.0, -0.5, -0.25),
                   turn_index=(-1, 0, 0), prompt_len=1, terminated=True, truncated=False,
                   stop_reason="submit", reward=1.0, result="diff", num_turns=1, num_tool_calls=1,
                   turns=(Turn(index=0, text="t", token_start=1, token_end=3, finish_reason="stop",
                               tool_calls=(ToolCall("submit"),), observation="ok"),))
    assert Trajectory.from_json(t.to_json()) == t
    hash(t)  # frozen all the way down
