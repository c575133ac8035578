"""Model-output format: parsing turns into reasoning + actions, and rendering with the chat template.

Two action formats (`ActionFormat.kind`):
- `tool_call` (SWE): optional `<think>…</think>` then exactly one Qwen-style call
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- `tag` (text games): optional `<think>…</think>` then `<action>…</action>` or `<answer>…</answer>`.

Rendering never re-tokenises model output: prompts and observation turns are rendered by the
tokenizer's own chat template and tokenised once; `measure_drift` checks afterwards that the
token-exact sequence still equals a fresh rendering of the same conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from swerl.structs import ChatMessage, ParsedTurn, ToolCall, ToolSpec


@dataclass(frozen=True)
class ActionFormat:
    """How actions are written in model output."""

    kind: str = "tool_call"
    """`tool_call`: Qwen-style `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
    `tag`: text games' `<action>…</action>` / `<answer>…</answer>`."""
    think_open: str = "<think>"
    """Tag that opens optional reasoning."""
    think_close: str = "</think>"
    """Tag that closes it."""
    call_open: str = "<tool_call>"
    """Tag that opens a tool call (kind `tool_call`)."""
    call_close: str = "</tool_call>"
    """Tag that closes a tool call."""
    action_tags: tuple[str, ...] = ("action", "answer")
    """Tag names accepted as actions (kind `tag`)."""
    max_calls_per_turn: int = 1
    """Calls allowed in one turn; more is malformed."""
    allow_text_after_action: bool = False
    """Whether text may follow the last action block (SWE-agent style: no)."""

    def __post_init__(self) -> None:
        if self.kind not in ("tool_call", "tag"):
            raise ValueError(f"ActionFormat.kind must be 'tool_call' or 'tag', got {self.kind!r}")
        if self.max_calls_per_turn < 1:
            raise ValueError(f"ActionFormat.max_calls_per_turn must be >= 1, got {self.max_calls_per_turn}")
        if self.kind == "tag" and not self.action_tags:
            raise ValueError("ActionFormat.action_tags is empty: name at least one tag (e.g. 'action')")


TOOL_CALL_FORMAT = ActionFormat()
TAG_FORMAT = ActionFormat(kind="tag")


# ---- parsing -----------------------------------------------------------------------------------

def _call_example(fmt: ActionFormat) -> str:
    return (f'{fmt.call_open}\n{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}\n'
            f'{fmt.call_close}')


def format_help(fmt: ActionFormat, tools: Sequence[ToolSpec] = ()) -> str:
    """How to write an action, appended to every format error so the model can correct itself."""
    if fmt.kind == "tag":
        tags = " or ".join(f"<{t}>…</{t}>" for t in fmt.action_tags)
        return f"End your message with exactly one {tags} block, with nothing after it."
    lines = ["End your message with exactly one tool call and nothing after it, written as:\n"
             f"{_call_example(fmt)}"]
    if tools:
        lines.append("Available tools: " + ", ".join(t.name for t in tools) + ".")
    return "\n".join(lines)


def _blocks(text: str, start: int, open_tag: str,
            close_tag: str) -> tuple[list[tuple[int, int, int, int]], str]:
    """(block_start, inner_start, inner_end, block_end) of each open…close block from `start`."""
    found: list[tuple[int, int, int, int]] = []
    pos = start
    while (i := text.find(open_tag, pos)) != -1:
        j = text.find(close_tag, i + len(open_tag))
        if j == -1:
            return [*found, (i, i + len(open_tag), len(text),
                             len(text))], f"{open_tag} is never closed with {close_tag}"
        found.append((i, i + len(open_tag), j, j + len(close_tag)))
        pos = j + len(close_tag)
    return found, ""


def parse_turn(text: str, fmt: ActionFormat = TOOL_CALL_FORMAT, tools: Sequence[ToolSpec] = ()) -> ParsedTurn:
    """Split one model turn into reasoning and actions; a malformed turn has `error` set, addressed
    to the model. Action spans are reported even for malformed blocks: they are still the model's
    attempt at an action, and the learner weighs them as such."""
    # Actions are only looked for after the reasoning: a call sketched inside <think> is not made.
    region = 0
    think_err = ""
    if fmt.think_close in text:
        region = text.rfind(fmt.think_close) + len(fmt.think_close)
    elif fmt.think_open in text:
        region = len(text)
        think_err = (f"Your reasoning was opened with {fmt.think_open} but never closed with "
                     f"{fmt.think_close}.")

    if fmt.kind == "tool_call":
        blocks, unclosed = _blocks(text, region, fmt.call_open, fmt.call_close)
        names = [fmt.call_open] * len(blocks)
    else:
        blocks, unclosed, names = [], "", []
        for tag in fmt.action_tags:
            b, err = _blocks(text, region, f"<{tag}>", f"</{tag}>")
            blocks += b
            names += [tag] * len(b)
            unclosed = unclosed or err
        order = sorted(range(len(blocks)), key=lambda k: blocks[k][0])
        blocks, names = [blocks[k] for k in order], [names[k] for k in order]
    spans = tuple((b[0], b[3]) for b in blocks)
    reasoning = _reasoning(text, spans, fmt)

    def bad(msg: str) -> ParsedTurn:
        return ParsedTurn(text=text, reasoning=reasoning, action_spans=spans,
                          error=f"{msg}\n{format_help(fmt, tools)}")

    what = "tool call" if fmt.kind == "tool_call" else "action"
    if think_err:
        return bad(think_err)
    if unclosed:
        return bad(f"Your {what} is incomplete: {unclosed}.")
    if not blocks:
        return bad(f"Your last message contained no {what}.")
    if len(blocks) > fmt.max_calls_per_turn:
        return bad(f"Your last message contained {len(blocks)} {what}s; only {fmt.max_calls_per_turn} "
                   "is allowed per message. Make one, wait for its result, then make the next.")
    trailing = text[blocks[-1][3]:]
    if trailing.strip() and not fmt.allow_text_after_action:
        snippet = trailing.strip()
        snippet = snippet if len(snippet) <= 80 else snippet[:77] + "..."
        return bad(f"Your last message had text after the {what} ({snippet!r}); the {what} must come last.")

    calls: list[ToolCall] = []
    for (_, a, b, _), name in zip(blocks, names, strict=True):
        inner = text[a:b]
        if fmt.kind == "tag":
            calls.append(ToolCall(name=name, arguments_json=json.dumps({"content": inner.strip()})))
            continue
        call, err = _parse_call(inner, tools)
        if err:
            return bad(err)
        assert call is not None
        calls.append(call)
    return ParsedTurn(text=text, reasoning=reasoning, tool_calls=tuple(calls), action_spans=spans)


def _reasoning(text: str, spans: Sequence[tuple[int, int]], fmt: ActionFormat) -> str:
    parts, pos = [], 0
    for s, e in spans:
        parts.append(text[pos:s])
        pos = e
    parts.append(text[pos:])
    out = "".join(parts).replace(fmt.think_open, "").replace(fmt.think_close, "")
    return out.strip()


def _parse_call(inner: str, tools: Sequence[ToolSpec]) -> tuple[ToolCall | None, str]:
    body = inner.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, (f"The tool call is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}. "
                      "Strings must use double quotes and escape newlines as \\n.")
    if not isinstance(obj, dict):
        return None, ("The tool call must be a JSON object with \"name\" and \"arguments\", got "
                      f"{type(obj).__name__}.")
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return None, f"The tool call has unexpected keys {extra}; it takes only \"name\" and \"arguments\"."
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "The tool call has no \"name\" (a string naming the tool)."
    args: Any = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's API does
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, "The tool call's \"arguments\" is a string that is not a JSON object."
    if not isinstance(args, dict):
        return None, f"The tool call's \"arguments\" must be a JSON object, got {type(args).__name__}."
    if tools:
        spec = next((t for t in tools if t.name == name), None)
        if spec is None:
            return None, f"Unknown tool {name!r}. Available tools: {', '.join(t.name for t in tools)}."
        err = validate_arguments(spec, args)
        if err:
            return None, err
    return ToolCall(name=name, arguments_json=json.dumps(args, ensure_ascii=False, sort_keys=True)), ""


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def _type_ok(value: Any, schema: dict) -> bool:
    kind = schema.get("type")
    if kind is None:
        return True
    kinds = kind if isinstance(kind, list) else [kind]
    for k in kinds:
        # bool is an int in Python but not in JSON schema
        if isinstance(value, _JSON_TYPES.get(k, (object,))) and not (k in ("integer", "number")
                                                                     and isinstance(value, bool)):
            if k == "array" and "items" in schema:
                return all(_type_ok(v, schema["items"]) for v in value)
            return True
    return False


def validate_arguments(spec: ToolSpec, args: dict) -> str:
    """The problems of `args` against the tool's schema (the subset tools use), as one message."""
    schema = spec.parameters
    props: dict = schema.get("properties", {})
    problems = []
    missing = [r for r in schema.get("required", []) if r not in args]
    if missing:
        problems.append(f"missing required argument(s) {missing}")
    unknown = sorted(set(args) - set(props))
    if unknown:
        problems.append(f"unknown argument(s) {unknown}")
    for key, value in args.items():
        p = props.get(key)
        if p is None:
            continue
        if not _type_ok(value, p):
            want = p.get("type")
            if want == "array" and "items" in p:
                want = f"array of {p['items'].get('type')}"
            problems.append(f"argument {key!r} must be {want}, got {json.dumps(value)[:60]}")
        elif "enum" in p and value not in p["enum"]:
            problems.append(f"argument {key!r} must be one of {p['enum']}, got {value!r}")
    if not problems:
        return ""
    sig = ", ".join(f"{k}: {v.get('type')}{'' if k in schema.get('required', []) else ' (optional)'}"
                    for k, v in props.items())
    return (f"Invalid arguments for tool {spec.name!r}: " + "; ".join(problems)
            + f". Its arguments are: {sig}.")


# ---- token offsets -----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE's printable-character alphabet, inverted: character → byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _token_bytes(tok: Any, ids: Sequence[int]) -> list[bytes] | None:
    """Each token's bytes, for byte-level BPE tokenizers (None when the tokenizer is not one)."""
    added = tok.added_tokens_decoder
    table = _byte_decoder()
    out = []
    for tid, piece in zip(ids, tok.convert_ids_to_tokens(list(ids)), strict=True):
        if tid in added:
            out.append(added[tid].content.encode("utf-8"))
            continue
        if piece is None or any(ch not in table for ch in piece):
            return None
        out.append(bytes(table[ch] for ch in piece))
    return out


def token_char_spans(tok: Any, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of `ids` and each token's [start, end) character span in it.

    Tokens are decoded individually (to bytes, so a multi-byte character split over tokens is
    attributed to every token holding part of it). Falls back to per-token string decoding for
    tokenizers that are not byte-level."""
    pieces = _token_bytes(tok, ids)
    if pieces is None:
        strs = [tok.decode([t], skip_special_tokens=False) for t in ids]
        spans, pos = [], 0
        for s in strs:
            spans.append((pos, pos + len(s)))
            pos += len(s)
        return "".join(strs), spans
    data = b"".join(pieces)
    text = data.decode("utf-8", "replace")
    # character index of every byte: a replacement character may stand for several bytes, so walk
    # the bytes with an incremental decoder instead of assuming utf-8 lengths
    char_of_byte = _char_index_of_bytes(data)
    spans, pos = [], 0
    for p in pieces:
        if not p:
            c = char_of_byte[pos] if pos < len(data) else len(text)
            spans.append((c, c))
            continue
        spans.append((char_of_byte[pos], char_of_byte[pos + len(p) - 1] + 1))
        pos += len(p)
    return text, spans


def _char_index_of_bytes(data: bytes) -> list[int]:
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")("replace")
    out: list[int] = []
    pending: list[int] = []
    nchars = 0
    for i in range(len(data)):
        pending.append(i)
        s = dec.decode(data[i:i + 1])
        if s:
            # the pending bytes produced len(s) characters: give each byte the first one, and the
            # last byte the last one, so spans cover all of them
            out.extend([nchars] * len(pending))
            out[-1] = nchars + len(s) - 1
            nchars += len(s)
            pending = []
    # bytes of an incomplete character at the very end: they become one replacement character
    out.extend([nchars] * len(pending))
    return out


# ---- rendering ---------------------------------------------------------------------------------

def _msgs(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def template_text(tok: Any) -> str:
    """The chat template (the default one of several named ones); empty when there is none."""
    template = getattr(tok, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), "")
    return str(template)


def tools_in_template(tok: Any) -> bool:
    """Whether the chat template writes tool specs itself (a `tools` block: Qwen's, Hermes-style ones).
    A template without one (SmolLM2's plain ChatML) gets them from swerl, in the system message
    (`with_tool_prompt`)."""
    return "tools" in template_text(tok)


TOOL_PROMPT = """# Tools

You may call one of these tools to act. Their signatures, as JSON schemas, are inside <tools></tools>:
<tools>
{specs}
</tools>

To call a tool, end your message with exactly one call and nothing after it, written as:
{example}
The tool's output comes back in the next message."""
"""How the tools are described to a model whose template has no `tools` block: their JSON schemas and the
call format the parser reads (the `tool_call` ActionFormat's tags)."""


def with_tool_prompt(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec],
                     fmt: ActionFormat = TOOL_CALL_FORMAT) -> list[ChatMessage]:
    """`messages` with the tool block (`TOOL_PROMPT`) at the end of the system message (one is added
    first when there is none)."""
    block = TOOL_PROMPT.format(specs="\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools),
                               example=_call_example(fmt))
    if messages and messages[0].role == "system":
        return [ChatMessage("system", f"{messages[0].content}\n\n{block}"), *messages[1:]]
    return [ChatMessage("system", block), *messages]


def render(tok: Any, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = (), *,
           add_generation_prompt: bool) -> str:
    """The chat template's text for a conversation, the tool specs in the system turn: written by the
    template where it has a `tools` block, else by swerl (`with_tool_prompt`)."""
    if tools and not tools_in_template(tok):
        messages, tools = with_tool_prompt(messages, tools), ()
    text = tok.apply_chat_template(_msgs(messages), tools=[t.to_openai() for t in tools] or None,
                                   add_generation_prompt=add_generation_prompt, tokenize=False)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


def encode(tok: Any, text: str) -> list[int]:
    """Tokenise rendered template text (special tokens in it are parsed, none are added)."""
    return list(tok(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class ObservationFrame:
    """The template's text around a tool response, after the model's end-of-turn token:
    `prefix + observation + suffix` is what the template renders between two model turns."""

    prefix: str
    suffix: str

    def wrap(self, observation: str) -> str:
        return self.prefix + observation + self.suffix


_A_MARK = "\u2063SWERL-ASSISTANT-MARK\u2063"
_O_MARK = "\u2063SWERL-OBSERVATION-MARK\u2063"


def observation_frame(tok: Any, messages: Sequence[ChatMessage],
                      tools: Sequence[ToolSpec] = ()) -> ObservationFrame:
    """Derive the tool-response framing from the template itself: render the conversation with an
    assistant turn and a tool message (plus the generation prompt) and cut around the markers. The
    model's own turn ends at its end-of-turn token; everything after it up to the next generation
    prompt is the frame. Works for any template that renders a `tool` role."""
    conv = [*messages, ChatMessage("assistant", _A_MARK), ChatMessage("tool", _O_MARK)]
    text = render(tok, conv, tools, add_generation_prompt=True)
    eos = tok.eos_token
    a = text.find(_A_MARK + eos)
    o = text.find(_O_MARK)
    if a == -1 or o == -1 or o < a or text.count(_O_MARK) != 1:
        raise RuntimeError(
            "cannot derive the tool-response format from the chat template: rendering an assistant turn "
            f"followed by a tool message did not show the assistant text followed by {eos!r} and then the "
            "tool message once. The template must render assistant turns ending with the eos token and a "
            "`tool` role."
        )
    return ObservationFrame(prefix=text[a + len(_A_MARK) + len(eos):o], suffix=text[o + len(_O_MARK):])


@dataclass(frozen=True)
class Drift:
    """How a token-exact sequence differs from a fresh rendering + tokenisation."""

    tokens: int
    """Differing positions over the common length plus the tokens the fresh rendering lacks."""
    first_index: int
    """First differing position, -1 when none."""


def measure_drift(tok: Any, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec],
                  token_ids: Sequence[int], *, ends_with_generation_prompt: bool = False) -> Drift:
    """Compare `token_ids` with the template's rendering of `messages`, tokenised in one go.

    The fresh rendering may run past the sequence (the template closes the last assistant turn
    with `<|im_end|>\\n` even when generation stopped at the end-of-turn token or at max_new_tokens,
    and a probe message follows it, see below); those extra tokens are not drift. Anything else
    is: a template that renders history differently from how it rendered prompts (e.g. stripping
    earlier reasoning), a BPE merge across a segment boundary, or a tampered token."""
    conv = list(messages)
    if not ends_with_generation_prompt and conv and conv[-1].role == "assistant":
        # Render the last turn as history, the way every earlier turn was checked: templates may render
        # a conversation's final assistant message specially (Qwen3 prepends an empty <think> block
        # to it), which says nothing about the tokens the model saw. The probe's tokens lie past the
        # sequence's end and are not compared.
        conv.append(ChatMessage("tool", ""))
    fresh = encode(tok, render(tok, conv, tools, add_generation_prompt=ends_with_generation_prompt))
    n = min(len(fresh), len(token_ids))
    diff = [i for i in range(n) if fresh[i] != token_ids[i]]
    missing = max(0, len(token_ids) - len(fresh))
    first = diff[0] if diff else (n if missing else -1)
    return Drift(tokens=len(diff) + missing, first_index=first)


def tool_call_text(name: str, arguments: dict | None = None, fmt: ActionFormat = TOOL_CALL_FORMAT) -> str:
    """A call written the way Qwen's template renders one (what scripted policies and demos emit)."""
    body = json.dumps({"name": name, "arguments": arguments or {}}, ensure_ascii=False)
    return f"{fmt.call_open}\n{body}\n{fmt.call_close}"
