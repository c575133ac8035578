"""Any model output gets an observation: a seeded fuzzer drives the real episode loop (real Qwen
tokenizer, real parser, the SWE tools) against a real sandbox with hostile and malformed tool calls —
NUL bytes, lone surrogates, 400-digit and non-finite numbers, absurd and oversize paths and strings,
wrong types, unknown tools, broken JSON — and no episode may crash."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from swerl.agent import ScriptedEngine, ToolEnv, load_tokenizer, run_episode
from swerl.structs import EpisodeLimits, SamplingParams

pytestmark = pytest.mark.docker

EPISODES = 200
TURNS = 3


def _call(name, args, raw: dict[str, str] | None = None) -> str:
    """A tool call as a model would write it: JSON with escapes (a lone surrogate or a NUL can only reach
    the parser as `\\udXXX` / `\\u0000` escapes in text). `raw`: arguments spliced in verbatim (numbers
    JSON cannot write with json.dumps, e.g. 1e400 or a 400-digit integer)."""
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=True)
    for key, text in (raw or {}).items():
        body = body[:-2] + (", " if args else "") + f'"{key}": {text}' + "}}"
    return f"<tool_call>\n{body}\n</tool_call>"


def _bad_turn(rng: random.Random) -> tuple[str, str]:
    """(turn text, what the observation must name): one hostile or malformed call."""
    big = "9" * 400
    long_path = "/testbed/" + "a" * 5000
    choices = [
        (_call("bash", {"command": "echo a\u0000b"}), "`command`"),
        (_call("bash", {"command": "echo \ud800"}), "`command`"),
        (_call("bash", {"command": "echo x"}, {"timeout": big}), "`timeout`"),
        (_call("bash", {"command": "echo x"}, {"timeout": "1e400"}), "`timeout`"),
        (_call("bash", {"command": "echo x"}, {"timeout": "NaN"}), "`timeout`"),
        (_call("bash", {"command": "echo " + "y" * 150_000}), "`command`"),
        (_call("str_replace_editor", {"command": "view", "path": long_path}), "`path`"),
        (_call("str_replace_editor", {"command": "view", "path": "/testbed/" + "b" * 300}), "`path`"),
        (_call("str_replace_editor", {"command": "create", "path": "/testbed/a\u0000b", "file_text": "x"}),
         "`path`"),
        (_call("str_replace_editor", {"command": "create", "path": "/testbed/s.txt", "file_text": "x\udfff"}),
         "`file_text`"),
        (_call("str_replace_editor", {"command": "insert", "path": "/testbed/s.txt", "new_str": "x"},
               {"insert_line": big}), "`insert_line`"),
        (_call("str_replace_editor", {"command": "view", "path": "/testbed"}, {"view_range": f"[1, {big}]"}),
         "`view_range`"),
        (_call("str_replace_editor", {"command": "str_replace", "path": "/testbed/s.txt", "old_str": "\u0000",
                                      "new_str": "y"}), "`old_str`"),
        (_call("str_replace_editor", {"command": "nope", "path": "/testbed/x"}), "`command`"),
        (_call("str_replace_editor", {"command": "view", "path": "relative/x"}), "not absolute"),
        (_call("no_such_tool", {}), "Unknown tool"),
        (_call("bash", {"command": 12}), ""),  # a wrong type: the parser's error
        (_call("bash", {}), ""),
        # broken JSON
        ("<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"\n</tool_call>", ""),
        ("<tool_call>\n[1, 2, 3]\n</tool_call>", ""),
        ("no call at all, just musing", ""),
        ("<tool_call>\n" + "{" * 5000 + "\n</tool_call>", ""),  # deep nesting
    ]
    return rng.choice(choices)


def _ok_turn(rng: random.Random) -> str:
    return rng.choice([_call("bash", {"command": "echo ok; ls /testbed | head -3"}),
                       _call("bash", {"command": "exit 3"}),  # the shell exits: a new one takes over
                       _call("str_replace_editor", {"command": "view", "path": "/testbed"}),
                       _call("bash", {"command": "printf 'x%.0s' $(seq 1 50000)"})])  # a big output


@pytest.fixture
def repo_sandbox(task_image):
    from swerl.sandbox import DockerSandbox, SandboxSpec

    with DockerSandbox(SandboxSpec(image=task_image)) as sb:  # a repository at /testbed: submit diffs it
        yield sb


def test_fuzzed_tool_calls_never_crash_an_episode_and_always_get_an_observation(repo_sandbox):
    sandbox = repo_sandbox
    tok = load_tokenizer()
    rng = random.Random(1234)
    env = ToolEnv(sandbox, "Fix the bug in /testbed.")
    crashes, bad_turns, checked = [], 0, 0
    t0 = time.monotonic()
    for ep in range(EPISODES):
        plan = [(_bad_turn(rng) if rng.random() < 0.8 else (_ok_turn(rng), "")) for _ in range(TURNS)]
        engine = ScriptedEngine(tok, [text for text, _ in plan] + [_call("submit", {})])
        try:
            traj = asyncio.run(run_episode(env, engine, tok, params=SamplingParams(max_new_tokens=200_000),
                                           limits=EpisodeLimits(max_turns=TURNS + 1,
                                                                max_context_tokens=10**7)))
        except Exception as e:  # the one thing that must never happen
            crashes.append(f"episode {ep}: {type(e).__name__}: {e}"[:300])
            continue
        for turn, (_, must_name) in zip(traj.turns[:TURNS], plan, strict=False):
            assert turn.observation, f"episode {ep} turn {turn.index}: no observation for {turn.text[:120]!r}"
            if must_name:
                bad_turns += 1
                # the tool names it `so`; the parser (types against the schema) names it 'so'
                names = {must_name, must_name.replace("`", "'")}
                assert any(n in turn.observation for n in names), (ep, turn.text[:200],
                                                                   turn.observation[:300])
                checked += 1
        assert traj.stop_reason in ("submit", "max_turns", "max_context"), traj.stop_reason
    took = time.monotonic() - t0
    print(f"fuzz: {EPISODES} episodes, {bad_turns} hostile calls named in their observation, "
          f"{len(crashes)} crashes, {took:.1f} s")
    assert crashes == [], crashes[:5]
    assert checked > EPISODES  # the fuzzer really sent hostile calls
    assert sandbox.run("echo alive").output == "alive\n"  # and the sandbox took it all
    assert took < 240
