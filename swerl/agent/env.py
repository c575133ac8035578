"""The environment protocol the episode drives, and `ToolEnv`: the SWE tools over a sandbox.

Real environments (SWE-bench, ALFWorld, WebShop) live in `swerl.envs` and implement `Env`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from swerl.agent.format import TOOL_CALL_FORMAT, ActionFormat
from swerl.agent.tools import SandboxTools, ToolConfig
from swerl.sandbox import Sandbox, SandboxSpec
from swerl.structs import ChatMessage, EnvStart, ParsedTurn, StepResult, Trajectory

DEFAULT_SYSTEM_PROMPT = (
    "You are a software engineer working in a repository. Investigate the task, change the code to "
    "solve it, check your change, then submit. Think step by step inside <think></think>, then make "
    "exactly one tool call per message."
)


@runtime_checkable
class Env(Protocol):
    """One episode's environment. `step` is only called with well-formed turns: the episode answers
    malformed ones itself. Methods are synchronous (sandboxes block); the episode runs them in a
    worker thread. An env that holds resources of its own may also have a `close()`: the runner
    calls it once when the episode is over, finished or failed, before releasing the sandbox."""

    action_format: ActionFormat
    """How the model writes actions for this environment."""

    def reset(self) -> EnvStart:
        """Start (or restart) the episode: the opening messages and the tools on offer."""
        ...

    def step(self, turn: ParsedTurn) -> StepResult:
        """Carry out the turn's action(s) and say what the model observes next."""
        ...


class ToolEnv:
    """A generic SWE-style environment: a task prompt and the `bash` / `str_replace_editor` /
    `submit` tools over a sandbox. `submit` terminates with the repository diff as the result; the
    reward is left to graders (None)."""

    action_format: ActionFormat = TOOL_CALL_FORMAT

    def __init__(self, sandbox: Sandbox, task: str, *, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 config: ToolConfig | None = None) -> None:
        if not task.strip():
            raise ValueError("ToolEnv needs a non-empty task prompt")
        self.sandbox = sandbox
        self.task = task
        self.system_prompt = system_prompt
        self.config = config or ToolConfig()
        self.tools = SandboxTools(sandbox, self.config)
        self._running = False

    def reset(self) -> EnvStart:
        self.tools = SandboxTools(self.sandbox, self.config)  # a new episode starts with no edit history
        self._running = True
        messages = (ChatMessage("system", self.system_prompt), ChatMessage("user", self.task))
        return EnvStart(messages=messages, tools=self.tools.specs)

    def step(self, turn: ParsedTurn) -> StepResult:
        if not self._running:
            # a tool call outside an episode would act on the sandbox (after submit: change the
            # tree that was just graded)
            raise RuntimeError("ToolEnv.step outside an episode: call reset() first (after `submit` the "
                               "episode is over)")
        if turn.malformed or not turn.tool_calls:
            raise ValueError("ToolEnv.step needs a well-formed turn with a tool call; the episode "
                             "answers malformed turns itself")
        results = [self.tools.execute(c) for c in turn.tool_calls]
        last = results[-1]
        observation = "\n\n".join(r.observation for r in results)
        if last.terminated:
            self._running = False
            return StepResult(observation=observation, terminated=True, reason="submit", result=last.result)
        return StepResult(observation=observation, error=any(r.error for r in results))


# Here, not in the runner: environments' task sets build these, and envs sit below the rollout package.
EnvFactory = Callable[[Sandbox | None], Env]
"""Builds an episode's Env around the sandbox the runner acquired for it (None when the episode's
spec names no sandbox, e.g. a text game that needs none)."""


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: which task, where it sits in its group, and how to build its Env."""

    task_id: str
    """The task (reported in the result)."""
    group: int
    """Group index (the episodes of one GRPO group share a task)."""
    sample: int
    """Index within the group."""
    make_env: EnvFactory
    """Builds the Env given the acquired sandbox. Called in a worker thread (it may block)."""
    sandbox: SandboxSpec | None = None
    """The sandbox the episode runs in (one pool per distinct spec); None: no sandbox."""
    finish: Callable[[Env, Trajectory], Trajectory] | None = None
    """Called after the episode (in a worker thread, the sandbox still held) to complete the
    trajectory, e.g. grade a truncated SWE episode's working tree and set its reward; an exception
    here fails the episode (kind `env`)."""
    report: Callable[[Env], Any] | None = None
    """Called after `finish` (in a worker thread, on the host the episode ran on) to take what the caller
    needs from the env before it is closed; its return value (plain, picklable values) comes back as
    `EpisodeResult.report`. An exception here fails the episode (kind `env`)."""
    latency_s: float = 0.0
    """Injected env time, for benchmarks of long-tail rollouts: after the episode (and `finish`) the
    runner sleeps this long on its event loop, the sandbox still held, as a slow tool or grading would
    take. 0: none."""
