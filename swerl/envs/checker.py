"""An environment checker in the spirit of Gymnasium's `check_env`: plays a script of model turns on
fresh environments from a factory and raises `EnvCheckError`, naming the check and what was seen,
where the environment breaks the `swerl.agent.Env` contract.

    from swerl.envs.checker import check_env
    report = check_env(lambda: PuzzleEnv(make_puzzle("sokoban"), "heldout-00000", SOKOBAN_PROMPT),
                       [scripted_turn(a, tag="answer") for a in plan])
    report.steps[-1].reason          # 'won'

What it checks:
- **types**: the env is an `Env` with an `ActionFormat`; `reset()` returns an `EnvStart` whose
  messages (a tuple of `ChatMessage`, system / user, ending on the user's) open the episode and
  whose tools are `ToolSpec`s with distinct names (at least one when actions are tool calls);
  `step()` returns a `StepResult` with a str observation, bool flags and a finite (or no) reward.
- **terminated vs truncated**: an env only ever says *terminated* (the task's own end, with a
  reason); running out of turns, context or time is the episode loop's *truncation*
  (`swerl.agent.episode`), so a terminated step naming a truncation reason is an error, as is a
  reason or a result on a step that did not terminate. `ends="terminated"`: the script's last turn
  and no earlier one terminates; `ends="open"`: none does (a script as long as the env's budget
  shows that the budget is left to the episode loop).
- **step after done** (`after_done="raises"`): once terminated, another `step` raises.
- **step before reset** (`before_reset="raises"`): `step` on a fresh env raises.
- **determinism**: a second env from the factory (same task, same seed) opens with an equal
  `EnvStart` and answers the script with equal `StepResult`s; with `reset_restarts`, `reset()` on
  the first env restarts it to the same opening and the same answers.
- **close**: when the env has `close()`, calling it twice raises nothing; every env the checker
  made is closed, also when a check fails.

`"allowed"` and `reset_restarts=False` state what an env does not promise; the caller says so
explicitly, so a gap in the contract is visible where the check is called.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from swerl.agent.env import Env
from swerl.agent.format import ActionFormat, parse_turn
from swerl.structs import ChatMessage, EnvStart, ParsedTurn, StepResult, ToolSpec

TRUNCATION_REASONS = frozenset({"max_turns", "max_context", "wall_clock", "max_new_tokens", "engine_abort"})
"""The stop reasons the episode loop gives truncated episodes (swerl/agent/episode.py's ending rules);
an env that terminates under one of these names has taken over the loop's job."""

OPENING_ROLES = ("system", "user")


class EnvCheckError(Exception):
    """The environment broke the Env contract; the message names the check and what was seen."""


@dataclass(frozen=True)
class EnvCheckReport:
    """What the first env did with the script (the others were checked equal to it)."""

    start: EnvStart
    turns: tuple[ParsedTurn, ...]
    """The script's turns as the env's action format parses them."""
    steps: tuple[StepResult, ...]


def _fail(name: str, check: str, detail: str) -> EnvCheckError:
    return EnvCheckError(f"{name}: {check}: {detail}")


def _check_protocol(env: Any, name: str) -> None:
    if not isinstance(env, Env):
        raise _fail(name, "protocol",
                    f"{type(env).__name__} lacks reset / step / action_format of swerl.agent.Env")
    if not isinstance(env.action_format, ActionFormat):
        raise _fail(name, "protocol",
                    f"action_format is a {type(env.action_format).__name__}, not an ActionFormat")
    close = getattr(env, "close", None)
    if close is not None and not callable(close):
        raise _fail(name, "protocol", "close is not callable")


def _check_start(start: Any, fmt: ActionFormat, name: str) -> EnvStart:
    if not isinstance(start, EnvStart):
        raise _fail(name, "reset", f"returned a {type(start).__name__}, not an EnvStart")
    msgs, tools = start.messages, start.tools
    if not isinstance(msgs, tuple) or not msgs or not all(isinstance(m, ChatMessage) for m in msgs):
        raise _fail(name, "reset", f"messages must be a non-empty tuple of ChatMessage, got {msgs!r:.200}")
    for m in msgs:
        if m.role not in OPENING_ROLES or not isinstance(m.content, str) or not m.content.strip():
            raise _fail(name, "reset", f"an opening message must be a non-empty system or user message, got "
                                       f"role {m.role!r} with {m.content!r:.80}")
    if msgs[-1].role != "user":
        raise _fail(name, "reset", f"the opening must end on the user's message (the model answers it), not "
                                   f"{msgs[-1].role!r}")
    if not isinstance(tools, tuple) or not all(isinstance(t, ToolSpec) for t in tools):
        raise _fail(name, "reset", f"tools must be a tuple of ToolSpec, got {tools!r:.200}")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise _fail(name, "reset", f"tool names repeat: {names}")
    if fmt.kind == "tool_call" and not tools:
        raise _fail(name, "reset", "actions are tool calls but no tool is on offer")
    return start


def _check_step(result: Any, i: int, name: str) -> StepResult:
    where = f"step {i + 1}"
    if not isinstance(result, StepResult):
        raise _fail(name, where, f"returned a {type(result).__name__}, not a StepResult")
    if not isinstance(result.observation, str):
        raise _fail(name, where, f"observation is a {type(result.observation).__name__}, not str")
    for flag in ("terminated", "error"):
        if type(getattr(result, flag)) is not bool:
            raise _fail(name, where, f"{flag} is {getattr(result, flag)!r}, not a bool")
    r = result.reward
    if r is not None and (isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r)):
        raise _fail(name, where, f"reward must be None or a finite number, got {r!r}")
    if not isinstance(result.reason, str) or not (result.result is None or isinstance(result.result, str)):
        raise _fail(name, where, f"reason must be str and result str or None, got {result.reason!r}, "
                                 f"{result.result!r:.80}")
    if result.terminated:
        if not result.reason:
            raise _fail(name, where, "terminated without a reason (say why the task ended)")
        if result.reason in TRUNCATION_REASONS:
            raise _fail(name, where, f"terminated with reason {result.reason!r}, which is a truncation: "
                                     "budgets are the episode loop's (EpisodeLimits), not the env's")
    elif result.reason or result.result is not None:
        raise _fail(name, where, f"not terminated, yet reason {result.reason!r} / result "
                                 f"{result.result!r:.80}: an unfinished step carries neither, or it would "
                                 "read as an ending")
    return result


def _play(env: Env, turns: Sequence[ParsedTurn], ends: str, name: str) -> tuple[StepResult, ...]:
    out = []
    for i, turn in enumerate(turns):
        step = _check_step(env.step(turn), i, name)
        last = i == len(turns) - 1
        if step.terminated and not (last and ends == "terminated"):
            expected = "only its last turn to" if ends == "terminated" else "no turn to"
            raise _fail(name, "ending", f"step {i + 1} of {len(turns)} terminated (reason {step.reason!r}); "
                                        f"the script expects {expected}")
        if last and ends == "terminated" and not step.terminated:
            raise _fail(name, "ending",
                        f"the script's last turn ({len(turns)}) did not terminate the episode")
        out.append(step)
    return tuple(out)


def _diff(a: Any, b: Any) -> str:
    """The first field where two dataclass values differ, for a readable determinism error."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y:
            return f"{f.name}: {x!r:.300} != {y!r:.300}"
    return "equal"


def _same(first: Any, again: Any, check: str, name: str) -> None:
    if isinstance(first, tuple):
        if len(first) != len(again):
            raise _fail(name, check, f"{len(first)} steps, then {len(again)}")
        for i, (a, b) in enumerate(zip(first, again, strict=True)):
            if a != b:
                raise _fail(name, check, f"step {i + 1} differs: {_diff(a, b)}")
    elif first != again:
        raise _fail(name, check, f"reset differs: {_diff(first, again)}")


def _raises(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as e:  # any error is the contract's answer; which one is the env's to document
        return e
    return None


def _close(env: Any, name: str) -> None:
    close = getattr(env, "close", None)
    if close is None:
        return
    for attempt in ("first", "second"):
        try:
            close()
        except Exception as e:
            raise _fail(name, "close", f"the {attempt} close() raised {type(e).__name__}: {e} (close must be "
                                       "idempotent)") from e


def check_env(make_env: Callable[[], Env], script: Sequence[str], *,
              ends: Literal["terminated", "open"] = "terminated",
              after_done: Literal["raises", "allowed"] = "raises",
              before_reset: Literal["raises", "allowed"] = "raises",
              reset_restarts: bool = True, name: str = "") -> EnvCheckReport:
    """Check the envs `make_env()` returns (each call: a fresh env of the same task and seed) against
    the Env contract by playing `script`, the model's turn texts, in order (see the module docstring
    for the checks and the options). Returns what the first env did; raises `EnvCheckError`."""
    if isinstance(script, str) or not script:
        raise ValueError("check_env needs a non-empty sequence of model turn texts")
    made: list[Any] = []

    def fresh() -> Any:
        env = make_env()
        made.append(env)
        return env

    env = fresh()
    name = name or type(env).__name__
    try:
        _check_protocol(env, name)
        start = _check_start(env.reset(), env.action_format, name)
        turns = []
        for i, text in enumerate(script):
            turn = parse_turn(text, env.action_format, start.tools)
            if turn.malformed or not turn.tool_calls:
                raise ValueError(f"check_env script turn {i + 1} is not a well-formed action for {name}'s "
                                 f"action format: {turn.error or 'no action'}")
            turns.append(turn)
        steps = _play(env, turns, ends, name)
        if ends == "terminated" and after_done == "raises" and _raises(lambda: env.step(turns[-1])) is None:
            raise _fail(name, "step after done", "a step after the episode terminated was carried out; "
                                                 "raise instead (or document it and check with "
                                                 "after_done='allowed')")
        if reset_restarts:
            _same(start, _check_start(env.reset(), env.action_format, name), "restart (reset again)", name)
            _same(steps, _play(env, turns, ends, name), "restart (same script after reset)", name)
        other = fresh()
        _check_protocol(other, name)
        if before_reset == "raises" and _raises(lambda: other.step(turns[0])) is None:
            raise _fail(name, "step before reset", "a step on an env that was never reset was carried out; "
                                                   "raise instead (or check with before_reset='allowed')")
        again = _check_start(other.reset(), other.action_format, name)
        _same(start, again, "determinism (a second env)", name)
        _same(steps, _play(other, turns, ends, name), "determinism (a second env)", name)
        for e in made:
            _close(e, name)
    except BaseException:
        for e in made:  # release what was made whatever failed; the check's own error is the one to see
            try:
                close = getattr(e, "close", None)
                if close is not None:
                    close()
            except Exception:
                pass
        raise
    return EnvCheckReport(start=start, turns=tuple(turns), steps=steps)


__all__ = ["TRUNCATION_REASONS", "EnvCheckError", "EnvCheckReport", "check_env"]
