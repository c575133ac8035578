"""Frozen dataclasses that several rooms exchange: exec results, sandbox specs, chat messages and tool
calls, env steps, sampling, turns, spans, trajectories and episode results. A room's own types live in
the room (`swerl.envs.swe.types`, `swerl.eval.types`, `swerl.learner.metrics`, `ActionFormat` in
`swerl.agent.format`, `ToolConfig` in `swerl.agent.tools`); importing one of them from here is refused
with its new home.

Nothing here imports from the rest of swerl: every module can depend on these types, and these
types depend on nothing but the standard library. Field docstrings double as `--help` text where a
struct is also a config section (see `swerl.config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command in a sandbox. A value, never an exception: a command that fails,
    times out or is OOM-killed is still a result the agent observes."""

    exit_code: int
    """Exit status of the command (128 + signal number when it was killed by a signal)."""
    output: str
    """Combined stdout and stderr, decoded as UTF-8 (invalid bytes replaced), capped: when
    `output_bytes` exceeds what is shown, the middle is replaced by a marker saying how much was cut."""
    duration_s: float
    """Wall-clock seconds from sending the command to receiving its result."""
    timed_out: bool = False
    """The command hit its timeout and was killed."""
    oom: bool = False
    """A process of the command was killed by the out-of-memory killer of the sandbox's cgroup."""
    output_bytes: int = 0
    """Total bytes the command wrote (at least this many if `output_limit_hit`)."""
    output_limit_hit: bool = False
    """The command wrote more than the sandbox keeps per command; its further writes failed."""
    disk_limit: bool = False
    """The sandbox's files outgrew `SandboxSpec.disk_limit` during the command: it was stopped (or, when
    it finished first, the space is still taken: delete files to go on)."""
    note: str = ""
    """Something the harness did that the caller should know (e.g. the shell was restarted)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        """Part of the output was cut before it reached the caller."""
        return self.output_limit_hit or len(self.output.encode("utf-8", "replace")) < self.output_bytes


def size_bytes(size: str, what: str = "size") -> int:
    """`500m`, `5g`, `1024k`, `123` (bytes) → bytes; ValueError naming `what` otherwise."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", size.lower())
    if not m:
        raise ValueError(f"{what} must be a size like 500m or 5g, got {size!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass(frozen=True)
class SandboxSpec:
    """How to start a sandbox: image, limits and safety settings."""

    image: str = "swerl-base:latest"
    """Docker image to run (a task image for a SWE task, the base image otherwise)."""
    workdir: str = "/testbed"
    """Directory the shell session starts in (and the repository whose `diff()` is taken)."""
    user: str = "auto"
    """User the commands run as: `auto` uses the image's `swerl.user` label (non-root in swerl's
    images) and root for images without one; or a name / uid[:gid]."""
    network: str = "none"
    """Docker network mode. `none` (no network at all) unless a task really needs more."""
    memory: str = "2g"
    """Memory limit (docker syntax, e.g. 512m, 4g); swap is disabled so the limit is real."""
    cpus: float = 1.0
    """CPU quota in cores."""
    pids: int = 256
    """Maximum number of processes and threads in the container (stops fork bombs)."""
    disk: str | None = None
    """Writable-layer size limit enforced by Docker (needs overlay2 on xfs with pquota); None = unlimited."""
    disk_limit: str | None = "5g"
    """Writable space the sandbox's files may take (all it writes outside the output spool: /testbed,
    /tmp, home), watched from the host while a command runs: past it the command is stopped and its
    result says `disk_limit`. Works on any backing filesystem (ext4 included), unlike `disk`; needs
    the daemon's overlay2 upper directory readable on this host (otherwise it is not watched).
    Sizes like 500m, 5g; None = unwatched."""
    output_limit: int = 50_000
    """Bytes of a command's output returned to the caller; past it the middle is cut with a marker."""
    output_spool: str = "64m"
    """Bytes a single command may write in total; writes past it fail (ENOSPC), so a flood
    can neither fill the host's memory nor the container's disk."""
    default_timeout: float = 120.0
    """Seconds a command may run when `run()` is not given a timeout."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the session, as (name, value) pairs."""

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("SandboxSpec.image is empty: name a Docker image (e.g. swerl-base:latest)")
        if not self.workdir.startswith("/"):
            raise ValueError(f"SandboxSpec.workdir must be an absolute path, got {self.workdir!r}")
        if self.cpus <= 0:
            raise ValueError(f"SandboxSpec.cpus must be > 0, got {self.cpus}")
        if self.pids < 16:
            raise ValueError(f"SandboxSpec.pids must be >= 16 (the shell needs some), got {self.pids}")
        if self.output_limit < 256:
            raise ValueError(f"SandboxSpec.output_limit must be >= 256 bytes, got {self.output_limit}")
        if self.default_timeout <= 0:
            raise ValueError(f"SandboxSpec.default_timeout must be > 0, got {self.default_timeout}")
        if self.disk_limit is not None:
            size_bytes(self.disk_limit, "SandboxSpec.disk_limit")


# ---- agent: chat, tools, parsing, generation, trajectories ----------------------------------------


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat conversation, as a chat template renders it."""

    role: str
    """`system`, `user`, `assistant` or `tool`."""
    content: str
    """The message text, verbatim (an assistant message holds the model's exact decoded output)."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call, described for the chat template (OpenAI function format)."""

    name: str
    """The function name the model writes in its call."""
    description: str
    """What the tool does, shown to the model."""
    parameters_json: str
    """The JSON schema (an object schema) of the arguments, as JSON text so the struct stays hashable."""

    def __post_init__(self) -> None:
        import json

        schema = json.loads(self.parameters_json)
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError(f"ToolSpec {self.name!r}: parameters must be a JSON object schema, got "
                             f"{schema!r}")

    @property
    def parameters(self) -> dict:
        """The argument schema as a fresh dict (callers may mutate it)."""
        import json

        return json.loads(self.parameters_json)

    def to_openai(self) -> dict:
        """`{"type": "function", "function": {...}}`, the shape Qwen's (and most) chat templates expect."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: a tool name and its arguments."""

    name: str
    """Tool name as written by the model (for `<action>`-style formats: the tag name)."""
    arguments_json: str = "{}"
    """The arguments as canonical JSON text (an object), so the struct is frozen and hashable."""

    @property
    def arguments(self) -> dict:
        """The arguments as a fresh dict."""
        import json

        return json.loads(self.arguments_json)


@dataclass(frozen=True)
class ParsedTurn:
    """What the parser found in one model turn."""

    text: str
    """The model's whole decoded text of the turn (end-of-turn token excluded)."""
    reasoning: str
    """Everything that is not an action, with the think tags removed and whitespace stripped."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The calls (or `<action>`/`<answer>` contents) found, in order; empty when malformed."""
    action_spans: tuple[tuple[int, int], ...] = ()
    """Character [start, end) spans in `text` of each action block, tags included."""
    error: str = ""
    """Why the turn is malformed, addressed to the model (empty when well-formed)."""

    @property
    def malformed(self) -> bool:
        return bool(self.error)


@dataclass(frozen=True)
class ToolResult:
    """The result of executing one tool call: a value the model observes, never an exception."""

    observation: str
    """Text shown to the model."""
    error: bool = False
    """The call failed (bad path, no match, command timed out, ...); the observation says why."""
    terminated: bool = False
    """The call ends the episode (`submit`)."""
    result: str | None = None
    """What the episode produced, for `submit`: the repository diff."""


@dataclass(frozen=True)
class EnvStart:
    """What an environment's `reset()` returns: the initial conversation and the tools on offer."""

    messages: tuple[ChatMessage, ...]
    """System and user messages that open the episode."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools rendered into the prompt by the chat template (empty for text games)."""


@dataclass(frozen=True)
class StepResult:
    """What an environment's `step()` returns for one (well-formed) model turn."""

    observation: str
    """Text fed back to the model as the tool response."""
    terminated: bool = False
    """The task ended (submitted, goal reached, game over)."""
    reward: float | None = None
    """Reward, when the environment knows it at this step."""
    reason: str = ""
    """Why the episode terminated (e.g. `submit`), when it did."""
    result: str | None = None
    """What the episode produced (e.g. the submitted patch)."""
    error: bool = False
    """The action failed; the observation explains it to the model."""


@dataclass(frozen=True)
class GameObs:
    """One observation of a text game (ALFWorld, WebShop), in-process or from a sandboxed game server:
    what `TextGame.reset` / `TextGame.step` return."""

    observation: str
    """The game's own text after the last action (for WebShop: page elements joined with ` [SEP] `)."""
    admissible: tuple[str, ...] = ()
    """Commands the game accepts now, in the game's order."""
    reward: float = 0.0
    """The game's native reward for this step (ALFWorld: 1.0 on the win; WebShop: the purchase score)."""
    won: bool = False
    """The goal is achieved (ALFWorld `won`; WebShop: score 1.0)."""
    done: bool = False
    """The game is over (won, bought, or lost); further steps are errors."""
    valid: bool = True
    """The last action was accepted (False: it was not admissible and changed nothing)."""
    info: tuple[tuple[str, str | float], ...] = ()
    """Named diagnostics (e.g. WebShop's reward components), as (name, value) pairs in a fixed order."""

    def info_dict(self) -> dict[str, str | float]:
        return dict(self.info)


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples one model turn."""

    temperature: float = 1.0
    """Softmax temperature (RL rollouts sample at 1.0 so logprobs match the policy)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 2048
    """Tokens the model may generate in one turn; past it the turn ends with finish_reason `length`."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the turn (the end-of-turn token is included by the episode)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Generation:
    """One engine generation: the tokens exactly as sampled."""

    token_ids: tuple[int, ...]
    """Sampled token ids, including the stop token when it ended the turn."""
    logprobs: tuple[float, ...]
    """The engine's log-probability of each sampled token (same length as token_ids)."""
    finish_reason: str
    """`stop` (a stop token), `length` (max_new_tokens) or `abort` (the engine gave up)."""
    weight_version: int | None = None
    """The policy version that sampled it (the training step whose weights the engine held when the call
    started), where the caller tracks versions (async training, `swerl.asyncrl`); None otherwise."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Generation: {len(self.token_ids)} token_ids but {len(self.logprobs)} logprobs")
        if self.finish_reason not in ("stop", "length", "abort"):
            raise ValueError("Generation.finish_reason must be stop|length|abort, got "
                             f"{self.finish_reason!r}")


class Span(IntEnum):
    """What a token of a trajectory is (`Trajectory.span`): the agent labels each token, ActFocus weighs
    reasoning and action tokens differently. Stored as plain ints in a Trajectory (JSON, tensors)."""

    CONTEXT = 0
    """Prompt or observation: tokens the model did not generate (loss mask 0)."""
    REASONING = 1
    """Generated text outside an action block (thinking, prose)."""
    ACTION = 2
    """Generated tokens of an action: a tool call or an `<action>` block (tags included), and the
    end-of-turn token of a turn that ends in one."""


@dataclass(frozen=True)
class Turn:
    """One model turn of an episode and what came back."""

    index: int
    """Turn number, from 0."""
    text: str
    """The model's decoded text (end-of-turn token excluded)."""
    token_start: int
    """Index in Trajectory.token_ids of the turn's first generated token."""
    token_end: int
    """Index one past the turn's last generated token."""
    finish_reason: str
    """The engine's finish reason for this turn."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls parsed from the turn (empty if malformed)."""
    malformed: bool = False
    """The turn could not be parsed into a valid call."""
    error: str = ""
    """The parse error shown to the model, when malformed."""
    observation: str = ""
    """The observation returned for the turn (empty when the episode ended before one)."""
    observation_tokens: int = 0
    """How many observation tokens were appended after the turn (0 when none was appended)."""
    weight_version: int | None = None
    """The policy version that generated the turn (`Generation.weight_version`); None when not tracked."""


@dataclass(frozen=True)
class Trajectory:
    """One episode, token-exact: what the model saw and generated, with per-token annotations."""

    token_ids: tuple[int, ...]
    """Prompt, generated and observation tokens exactly as fed to / sampled from the engine."""
    loss_mask: tuple[int, ...]
    """1 on model-generated tokens, 0 on prompt and observation tokens."""
    span: tuple[int, ...]
    """`Span` of each token: 0 prompt/observation, 1 reasoning, 2 action (tool call or `<action>` block)."""
    logprobs: tuple[float, ...]
    """Engine log-probability per token (0.0 on tokens the model did not generate)."""
    turn_index: tuple[int, ...]
    """Turn number of each generated token; -1 on prompt/observation tokens."""
    prompt_len: int
    """Number of prompt tokens at the start."""
    terminated: bool
    """The task ended (submit, the env said so)."""
    truncated: bool
    """A budget ended the episode (turns, context, wall clock, max_new_tokens)."""
    stop_reason: str
    """Why the episode ended: `submit`/env reason, `max_turns`, `max_context`, `wall_clock`,
    `max_new_tokens`, `engine_abort`."""
    reward: float | None = None
    """Episode reward (None until an environment or grader assigns one)."""
    result: str | None = None
    """What the episode produced (the submitted patch for SWE tasks)."""
    num_turns: int = 0
    """Model turns generated."""
    num_tool_calls: int = 0
    """Well-formed calls executed."""
    num_malformed: int = 0
    """Turns that could not be parsed into a valid call."""
    wall_time_s: float = 0.0
    """Seconds the episode took."""
    drift_tokens: int = 0
    """Positions where the token-exact sequence differs from a fresh render + tokenisation of the same
    conversation, plus the length difference. 0 = consistent."""
    drift_first_index: int = -1
    """First differing position, -1 when there is none."""
    drift_detected: bool = False
    """drift_tokens > 0: the learner should drop (or at least not re-render) this trajectory."""
    turns: tuple[Turn, ...] = ()
    """The model turns, in order."""
    tampered_files: tuple[str, ...] = ()
    """SWE: files of the graded patch the grading did not let count (`GradeResult.tampered_files`: test
    infrastructure put back, runner-shadowing files dropped); counted as `reward/tamper_rate`."""
    tampered: str = ""
    """SWE: the grade's evidence of a forged test run (`GradeResult.tampered`: canaries reported wrongly);
    counted as `reward/tamper_rate`."""
    turn_versions: tuple[int, ...] = ()
    """The policy version (training step whose weights sampled it) of each model turn, in turn order; empty
    when not tracked (the synchronous loop, where every turn is the step's own policy). With partial
    rollouts one episode's turns can differ; async training drops episodes whose oldest is too stale."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        for name in ("loss_mask", "span", "logprobs", "turn_index"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Trajectory.{name} has {len(getattr(self, name))} entries, "
                                 f"token_ids has {n}")
        if self.terminated and self.truncated:
            raise ValueError("Trajectory cannot be both terminated and truncated")
        if not 0 <= self.prompt_len <= n:
            raise ValueError(f"Trajectory.prompt_len {self.prompt_len} out of range [0, {n}]")

    def to_json(self) -> str:
        """One JSON object (a JSONL line)."""
        import dataclasses
        import json

        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Trajectory:
        import json

        d = json.loads(text)
        turns = tuple(
            Turn(**{**t, "tool_calls": tuple(ToolCall(**c) for c in t["tool_calls"])}) for t in d.pop("turns")
        )
        seqs = {k: tuple(d.pop(k)) for k in ("token_ids", "loss_mask", "span", "logprobs", "turn_index")}
        d["tampered_files"] = tuple(d.get("tampered_files", ()))
        d["turn_versions"] = tuple(d.get("turn_versions", ()))  # absent from records written before it
        return cls(**d, **seqs, turns=turns)


@dataclass(frozen=True)
class EpisodeLimits:
    """Budgets of one episode; hitting one ends it with truncated=True and the limit's name."""

    max_turns: int = 30
    """Model turns (reason `max_turns`)."""
    max_context_tokens: int = 32_768
    """Prompt + generated + observation tokens (reason `max_context`)."""
    wall_clock_s: float = 1800.0
    """Seconds for the whole episode (reason `wall_clock`)."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"EpisodeLimits.max_turns must be >= 1, got {self.max_turns}")
        if self.max_context_tokens < 2:
            raise ValueError(f"EpisodeLimits.max_context_tokens must be >= 2, got {self.max_context_tokens}")
        if self.wall_clock_s <= 0:
            raise ValueError(f"EpisodeLimits.wall_clock_s must be > 0, got {self.wall_clock_s}")


# ---- rollout: episode results ----------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeStats:
    """Where one episode's time and tokens went (measured by the runner around the engine and the
    environment, so it holds for any engine and env)."""

    turns: int = 0
    """Model turns generated."""
    tool_calls: int = 0
    """Well-formed calls executed."""
    malformed: int = 0
    """Turns that could not be parsed into a valid call."""
    prompt_tokens: int = 0
    """Tokens of the initial prompt."""
    generated_tokens: int = 0
    """Tokens the model sampled (loss-mask 1), over all turns."""
    total_tokens: int = 0
    """Prompt + generated + observation tokens of the final sequence."""
    wall_s: float = 0.0
    """Seconds from asking for a sandbox to the episode's end."""
    sandbox_acquire_s: float = 0.0
    """Seconds waiting for a sandbox (pool slot + container start when none was warm)."""
    engine_s: float = 0.0
    """Seconds inside engine calls, queueing for the engine's concurrency limit included."""
    engine_queue_s: float = 0.0
    """Of `engine_s`, seconds waiting for a free engine slot (the runner's concurrency limit)."""
    engine_calls: int = 0
    """Generate calls made."""
    env_s: float = 0.0
    """Seconds inside the environment's reset/step (tool calls in the sandbox)."""
    finish_s: float = 0.0
    """Seconds in the episode's finish hook (SWE: grading the tree of an episode cut by a budget)."""


@dataclass(frozen=True)
class EpisodeResult:
    """One episode the runner ran: its trajectory, or why there is none. A failed episode (sandbox
    died, engine timed out or failed, env raised) has `trajectory=None` and is excluded from
    training; it never fails the batch."""

    task_id: str
    """The task the episode worked on."""
    group: int
    """Group index (GRPO: the episodes of one group share a task and are compared with each other)."""
    sample: int
    """Index of the episode within its group."""
    trajectory: Trajectory | None
    """The token-exact trajectory; None when the episode failed."""
    error: str = ""
    """Why the episode failed (exception type and message); empty when it did not."""
    error_kind: str = ""
    """`sandbox`, `engine_timeout`, `engine`, `env`, `harness`, or `host` (its sandbox host was lost, on a
    cluster, after every requeue); empty when it did not fail."""
    stats: EpisodeStats = EpisodeStats()
    """Turns, tokens and time of the episode (partial when it failed)."""
    train_step: int | None = None
    """The training step whose rollouts the episode is (a resumed run cuts rollouts.jsonl back by it);
    None outside training."""
    host: str = ""
    """The sandbox host that ran the episode (`cluster.backend: ray`); empty on one machine."""
    report: object = None
    """What the episode spec's `report` hook took from the env as the episode ended (evaluation's sample
    facts: plain values, so they travel from a cluster's sandbox host); in memory only, not in to_json."""

    def __post_init__(self) -> None:
        if (self.trajectory is None) == (not self.error):
            raise ValueError("EpisodeResult needs exactly one of a trajectory and an error")

    @property
    def ok(self) -> bool:
        """The episode produced a trajectory (it may still be truncated)."""
        return self.trajectory is not None

    def to_json(self) -> str:
        """One JSON object (a JSONL line); the trajectory is nested as its own `to_json` object."""
        import dataclasses
        import json

        d = {"task_id": self.task_id, "group": self.group, "sample": self.sample,
             "train_step": self.train_step, "host": self.host, "error": self.error,
             "error_kind": self.error_kind,
             "stats": dataclasses.asdict(self.stats),
             "trajectory": None if self.trajectory is None else json.loads(self.trajectory.to_json())}
        return json.dumps(d, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> EpisodeResult:
        import json

        d = json.loads(text)
        tr = d.pop("trajectory")
        return cls(**{**d, "stats": EpisodeStats(**d["stats"]),
                      "trajectory": None if tr is None else Trajectory.from_json(json.dumps(tr))})


_MOVED = {
    "SWEInstance": "swerl.envs.swe.types",
    "Prediction": "swerl.envs.swe.types",
    "GradeResult": "swerl.envs.swe.types",
    "GradingConfig": "swerl.envs.swe.types",
    "EvalSummary": "swerl.eval.types",
    "EvalSample": "swerl.eval.types",
    "UpdateMetrics": "swerl.learner.metrics",
    "ActionFormat": "swerl.agent.format",
    "ToolConfig": "swerl.agent.tools",
}
"""Types that lived here before they moved to the room that owns them."""


def __getattr__(name: str) -> object:
    if name in _MOVED:
        raise ImportError(f"swerl.structs.{name} moved: import it from {_MOVED[name]}")
    raise AttributeError(f"module 'swerl.structs' has no attribute {name!r}")
