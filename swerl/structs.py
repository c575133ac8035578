"""Frozen dataclasses that cross module borders.

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


@dataclass(frozen=True)
class ToolConfig:
    """Limits and roots of the sandbox tools."""

    allowed_root: str = "/testbed"
    """Editor paths must lie inside this directory."""
    default_timeout_s: float = 60.0
    """Seconds a bash call may run when the model gives no timeout."""
    max_timeout_s: float = 300.0
    """Cap on the timeout the model may ask for."""
    max_observation_chars: int = 16_000
    """Observations longer than this keep their head and tail with a note of what was cut."""
    max_command_chars: int = 100_000
    """Longest `bash` command a call may send (longer ones get an error observation: write a file)."""
    max_text_chars: int = 2_000_000
    """Longest `file_text` / `old_str` / `new_str` of an editor call."""

    def __post_init__(self) -> None:
        if not self.allowed_root.startswith("/"):
            raise ValueError(f"ToolConfig.allowed_root must be absolute, got {self.allowed_root!r}")
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            raise ValueError("ToolConfig needs 0 < default_timeout_s <= max_timeout_s, got "
                             f"{self.default_timeout_s} and {self.max_timeout_s}")
        if self.max_observation_chars < 200:
            raise ValueError("ToolConfig.max_observation_chars must be >= 200, got "
                             f"{self.max_observation_chars}")


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


# ---- SWE tasks: instances, grading, evaluation ----------------------------------------------------


@dataclass(frozen=True)
class SWEInstance:
    """One task in SWE-bench's schema (plus the optional fields newer SWE-bench datasets and swerl's
    own offline suite carry). `swerl.envs.swe.instances` validates and builds these."""

    instance_id: str
    """Unique id, `owner__repo-number` in SWE-bench."""
    repo: str
    """`owner/name` of the repository."""
    base_commit: str
    """Commit the agent starts from (for generated tasks: the buggy tree)."""
    patch: str
    """The gold patch (what fixes the issue)."""
    test_patch: str
    """Patch adding or changing the tests that grade the task (may be empty)."""
    problem_statement: str
    """The issue text shown to the agent."""
    fail_to_pass: tuple[str, ...]
    """Tests that fail at base_commit + test_patch and pass once fixed (SWE-bench's FAIL_TO_PASS)."""
    pass_to_pass: tuple[str, ...]
    """Tests that pass before and after the fix (SWE-bench's PASS_TO_PASS)."""
    version: str = ""
    """Release of the repository the instance belongs to."""
    created_at: str = ""
    """When the issue was opened (ISO 8601)."""
    environment_setup_commit: str = ""
    """Commit whose environment the tests run in."""
    hints_text: str = ""
    """Extra hints (comments on the issue), usually not shown to the agent."""
    image: str = ""
    """Docker image the dataset names for the instance (newer SWE-bench schema), or empty."""
    eval_script: str = ""
    """Shell script that resets the tests, runs them between the START/END markers and resets again
    (newer SWE-bench schema); empty: swerl writes one from `test_cmd`."""
    log_parser: str = "parse_log_pytest"
    """Key of `swebench.harness.log_parsers.PARSER_REGISTRY` that parses the test log."""
    eval_type: str = "pass_and_fail"
    """`pass_and_fail` or `fail_only` (swebench.harness.constants.EvalType)."""
    test_cmd: str = ""
    """swerl: the test command run in /testbed when there is no `eval_script`."""
    source: str = ""
    """swerl: the library source (a file under tasks/swe/sources) the instance image is built from,
    for offline instances; empty for SWE-bench instances."""
    split: str = ""
    """Which split the instance belongs to (`train`, `heldout`, `test`, ...), when known."""
    setup_patch: str = ""
    """swerl: a diff the scrubbed image applies and commits on top of base_commit before anything runs
    (SWE-smith's bug: its images hold the clean repository); episodes and grading start from that
    commit. Empty: they start from base_commit itself."""

    def __post_init__(self) -> None:
        for name in ("instance_id", "repo", "base_commit"):
            if not getattr(self, name):
                raise ValueError(f"SWEInstance.{name} is empty")
        if self.eval_type not in ("pass_and_fail", "fail_only"):
            raise ValueError("SWEInstance.eval_type must be pass_and_fail or fail_only, got "
                             f"{self.eval_type!r}")

    def to_swebench(self) -> dict:
        """The instance as a SWE-bench record (FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded lists)."""
        import json

        d = {"instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
             "patch": self.patch, "test_patch": self.test_patch, "problem_statement": self.problem_statement,
             "hints_text": self.hints_text, "created_at": self.created_at, "version": self.version,
             "FAIL_TO_PASS": json.dumps(list(self.fail_to_pass)),
             "PASS_TO_PASS": json.dumps(list(self.pass_to_pass)),
             "environment_setup_commit": self.environment_setup_commit}
        for extra in ("image", "eval_script", "test_cmd", "source", "split"):
            if getattr(self, extra):
                d[extra] = getattr(self, extra)
        d["log_parser"], d["eval_type"] = self.log_parser, self.eval_type
        return d


@dataclass(frozen=True)
class Prediction:
    """One entry of a SWE-bench predictions file."""

    instance_id: str
    """The instance the patch is for."""
    model_patch: str | None
    """The patch (a unified diff); None or empty counts as an empty patch."""
    model_name_or_path: str = ""
    """Who produced it."""


@dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one patch on one instance in a fresh container."""

    instance_id: str
    """The graded instance."""
    resolved: bool
    """Every FAIL_TO_PASS and PASS_TO_PASS test passed (SWE-bench's RESOLVED_FULL)."""
    reward: float
    """1.0 when resolved; otherwise 0.0, or the fraction of graded tests passing with partial reward."""
    status: str = ""
    """SWE-bench's resolution status: RESOLVED_FULL, RESOLVED_PARTIAL or RESOLVED_NO; empty on error."""
    empty_patch: bool = False
    """The patch was empty (nothing was applied; the tests ran on the base commit)."""
    applied: bool = False
    """The patch applied (`git apply` or the `patch --fuzz` fallback); True for an empty patch."""
    apply_method: str = ""
    """Which command applied it (`git apply --verbose`, a fallback, `patch --batch ...`), or empty."""
    fail_to_pass_success: tuple[str, ...] = ()
    """FAIL_TO_PASS tests that passed."""
    fail_to_pass_failure: tuple[str, ...] = ()
    """FAIL_TO_PASS tests that failed, errored, were skipped or did not run."""
    pass_to_pass_success: tuple[str, ...] = ()
    """PASS_TO_PASS tests that passed (or were skipped)."""
    pass_to_pass_failure: tuple[str, ...] = ()
    """PASS_TO_PASS tests that failed, errored or did not run."""
    test_status: tuple[tuple[str, str], ...] = ()
    """Every (test id, status) pair the log parser found."""
    failed_tests: tuple[str, ...] = ()
    """Why it is not resolved, test by test (`swerl.envs.swe.grading.name_failures`): `FAIL_TO_PASS TEST:
    STATUS | LOG LINE` for each FAIL_TO_PASS test that did not pass, and each PASS_TO_PASS test that failed
    or was skipped."""
    tampered_files: tuple[str, ...] = ()
    """Files of the patch the grading did not let count: new files that would shadow the test runner or a
    module it imports (dropped from the patch), and test infrastructure put back to the base commit
    (test files, conftest.py, pytest / tox / setup.cfg / pyproject / noxfile) that the patch changed."""
    runner_words: tuple[str, ...] = ()
    """Source files whose change adds a line of the grading's `RUNNER_TAMPERING` list (test-runner
    internals, hard exits, result words): a signal for review, not a verdict (the canaries decide)."""
    tampered: str = ""
    """Evidence that the test run was forged: canary tests (`swerl.envs.swe.canary`) the run reported
    wrongly or not at all. Such a grade is the policy's own doing: not resolved, reward 0 (a verdict, not
    a failure)."""
    canaries: int = 0
    """Canary tests the grading placed beside the instance's tests and checked (0: the runner or the test
    command allows none, or `GradingConfig.canaries` is off)."""
    error: str = ""
    """Why no grade could be given (image missing, patch did not apply, tests timed out, ...)."""
    failure: str = ""
    """Set when the grading itself failed, not the patch: `image` (no image, or one that cannot be
    scrubbed), `instance` (the row gives no way to run its tests), `sandbox` (the container or the
    daemon went away), `environment` (the test command is missing in the image). Such a grade is no
    verdict: `reward` means nothing, training excludes the episode and evaluation retries it. Empty when
    the grade is the task's verdict (including a patch that does not apply, tests that time out)."""
    log_path: str = ""
    """Host path of the test log (SWE-bench's test_output.txt format)."""
    patch_sha256: str = ""
    """Hash of the graded patch (a resumed evaluation re-grades when the patch changed)."""
    image_s: float = 0.0
    """Seconds to find or build the image."""
    start_s: float = 0.0
    """Seconds to start the container."""
    apply_s: float = 0.0
    """Seconds to apply the patch."""
    test_s: float = 0.0
    """Seconds the eval script ran."""
    total_s: float = 0.0
    """Seconds in all."""

    @property
    def failed(self) -> bool:
        """The grading failed (infrastructure): no verdict."""
        return bool(self.failure)

    def to_json(self) -> str:
        import dataclasses
        import json

        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> GradeResult:
        import json

        d = json.loads(text)
        for k in ("fail_to_pass_success", "fail_to_pass_failure", "pass_to_pass_success",
                  "pass_to_pass_failure", "tampered_files", "runner_words", "failed_tests"):
            if k in d:  # tampered_files: absent from grades written before it existed
                d[k] = tuple(d[k])
        d["test_status"] = tuple(tuple(p) for p in d["test_status"])
        return cls(**d)


@dataclass(frozen=True)
class EvalSummary:
    """The result of grading a predictions file: SWE-bench's report counts plus the resolve rate."""

    total_instances: int
    """Instances in the task set."""
    submitted_ids: tuple[str, ...]
    """Instances with a prediction."""
    resolved_ids: tuple[str, ...]
    """Graded and resolved."""
    unresolved_ids: tuple[str, ...]
    """Graded and not resolved."""
    empty_patch_ids: tuple[str, ...]
    """Submitted with an empty patch (not run, as in SWE-bench)."""
    error_ids: tuple[str, ...]
    """Could not be graded (no image, patch did not apply, timeout, harness error)."""
    incomplete_ids: tuple[str, ...]
    """In the task set but without a prediction."""
    failed_ids: tuple[str, ...] = ()
    """Of `error_ids`: those whose grading failed for an infrastructure reason after every retry (no
    image, a container that died, a broken environment): no verdict, not unresolved; rerun them."""
    out_dir: str = ""
    """Where report.json, report.md and instances/ were written."""

    @property
    def resolve_rate(self) -> float:
        """Resolved over all instances in the task set (SWE-bench's headline number)."""
        return len(self.resolved_ids) / self.total_instances if self.total_instances else 0.0


@dataclass(frozen=True)
class GradingConfig:
    """How a patch is graded (a config section: `swe.grading`)."""

    timeout_s: float = 1800.0
    """Seconds the tests may run (SWE-bench's harness default); past it the grade is an error (SWE-bench:
    Tests Timed Out)."""
    retries: int = 2
    """`swerl eval --predictions`: more gradings of an instance whose grading failed for an
    infrastructure reason (`GradeResult.failure`) before it is reported as failed."""
    memory: str = "2g"
    """Memory limit of the grading container."""
    cpus: float = 1.0
    """CPU quota of the grading container."""
    partial_reward: bool = False
    """False: reward is 1 if resolved else 0. True: an unresolved patch that keeps every
    PASS_TO_PASS test passing earns the fraction of FAIL_TO_PASS tests it fixes."""
    log_limit: int = 4_000_000
    """Bytes of test output kept (head and tail; pytest's summary is at the tail)."""
    canaries: bool = True
    """Run canary tests (fresh random names, known outcomes, decoys named as FAIL_TO_PASS tests) beside the
    instance's tests; a run that reports one wrongly is tampered (reward 0). Off only to measure their cost
    or what a forger earns without them."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"GradingConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.log_limit < 10_000:
            raise ValueError(f"GradingConfig.log_limit must be >= 10000 bytes, got {self.log_limit}")


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
    """`sandbox`, `engine_timeout`, `engine`, `env` or `harness`; empty when it did not fail."""
    stats: EpisodeStats = EpisodeStats()
    """Turns, tokens and time of the episode (partial when it failed)."""
    train_step: int | None = None
    """The training step whose rollouts the episode is (a resumed run cuts rollouts.jsonl back by it);
    None outside training."""

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
             "train_step": self.train_step, "error": self.error, "error_kind": self.error_kind,
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


# ---- learner: what one update reports ----------------------------------------------------------


@dataclass(frozen=True)
class UpdateMetrics:
    """What one learner update did (ppo_epochs × mini_batches optimizer steps over a batch of episodes);
    a metrics.jsonl row; losses, clip fractions and grad norm are means over its optimizer steps.
    Token averages are over the model-generated tokens (loss mask 1) of the episodes kept."""

    step: int
    """Optimizer steps taken after this update (the learner's step counter)."""
    skipped: bool
    """No optimizer step was taken (every episode was filtered out, e.g. by DAPO's filter)."""
    episodes: int
    """Episodes in the batch handed to the learner."""
    episodes_kept: int
    """Episodes left after the DAPO filter (all of them when it is off)."""
    tokens: int
    """Model-generated tokens of the kept episodes (the tokens in the loss)."""
    micro_batches: int
    """Micro-batches run (forward + backward) over all optimizer steps of the update."""
    optimizer_steps: int
    """Optimizer steps taken in this update (ppo_epochs × mini_batches; 0 when skipped)."""
    reward_mean: float
    """Mean episode reward of the batch (before overlong shaping, all episodes)."""
    reward_shaped_mean: float
    """Mean reward after overlong shaping (equal to reward_mean when it is off)."""
    advantage_mean: float
    """Mean episode advantage over the kept episodes."""
    advantage_abs_mean: float
    """Mean |advantage| over the kept episodes."""
    loss: float
    """Total loss: policy loss + kl_coef · KL."""
    pg_loss: float
    """The clipped policy-gradient loss."""
    kl: float
    """Token-mean KL(π‖π_ref) estimate (the configured kind); NaN when KL is off."""
    clipfrac_low: float
    """Fraction of tokens with A < 0 clipped at 1 − clip_low."""
    clipfrac_high: float
    """Fraction of tokens with A > 0 clipped at 1 + clip_high."""
    clipfrac_dual: float
    """Fraction of tokens where the dual clip applied."""
    approx_kl: float
    """½·(logp − old_logp)² averaged over tokens: how far the policy is from the rollout policy."""
    grad_norm: float
    """Gradient norm before clipping."""
    entropy: float
    """Mean policy entropy per token (nats)."""
    aem_alpha_mean: float
    """Mean AEM α over responses (1 when AEM is off or all α are 1)."""
    aem_alpha_min: float
    """Smallest AEM α."""
    aem_alpha_max: float
    """Largest AEM α."""
    actfocus_weight_action: float
    """Mean ActFocus weight of action tokens (1 when ActFocus is off)."""
    actfocus_weight_reasoning: float
    """Mean ActFocus weight of reasoning tokens (1 when ActFocus is off)."""
    action_token_share: float
    """Action tokens / generated tokens."""
    energy_action: float
    """Mean reference-model energy of action tokens; NaN when no reference pass ran."""
    energy_reasoning: float
    """Mean reference-model energy of reasoning tokens; NaN when no reference pass ran."""
    lr: float
    """Learning rate of the step."""
    update_s: float
    """Seconds the update took (pre-passes, forward, backward, optimizer step)."""
    tokens_per_s: float
    """Sequence tokens (padding excluded) processed per second of update_s."""
    actfocus_weight_min: float = 1.0
    """Smallest ActFocus weight over reasoning and action tokens (1 when ActFocus is off)."""
    actfocus_weight_max: float = 1.0
    """Largest ActFocus weight over reasoning and action tokens (1 when ActFocus is off)."""
    energy_reward_corr_pearson: float = float("nan")
    """ActFocus diagnostic: Pearson correlation across the kept rollout groups between a group's mean
    reference energy of action tokens and the variance of its rewards; NaN when no reference pass ran,
    fewer than 3 groups have action tokens, or either side has zero variance."""
    energy_reward_corr_spearman: float = float("nan")
    """Spearman (rank) version of energy_reward_corr_pearson; NaN under the same conditions."""
    energy_reward_corr_groups: int = 0
    """Rollout groups with action tokens that entered the correlation (0 without a reference pass)."""
    energy_reward_corr_reasoning_pearson: float = float("nan")
    """The same correlation for reasoning tokens' mean reference energy (ActFocus: about 0)."""
    energy_reward_corr_reasoning_spearman: float = float("nan")
    """Spearman version of energy_reward_corr_reasoning_pearson."""
    group_energy_action: tuple[float, ...] = ()
    """Per kept rollout group: mean reference energy of its action tokens (NaN: none); () without a
    reference pass. Kept so that correlations can be pooled over steps and runs."""
    group_energy_reasoning: tuple[float, ...] = ()
    """Per kept rollout group: mean reference energy of its reasoning tokens."""
    group_reward_var: tuple[float, ...] = ()
    """Per kept rollout group: population variance of its rewards."""
    is_ratio_mean: float = float("nan")
    """Mean ratio π_old/μ of the learner's over the engine's probability of the sampled tokens (per
    sequence at rollout_is.level sequence / geometric); NaN unless the learner recomputes old log-probs."""
    is_ratio_max: float = float("nan")
    """Largest such ratio."""
    is_capped_fraction: float = float("nan")
    """Share of ratios beyond rollout_is.cap (or under its lower bound in mask mode): capped or dropped
    when rollout_is is on, and how many would be when it is off."""
    mismatch_kl_k1: float = float("nan")
    """KL(engine ‖ learner) per token on the engine's samples, k1 = mean(log μ − log π_old)."""
    mismatch_kl_k3: float = float("nan")
    """The same with the k3 estimator, mean(r − 1 − log r) ≥ 0."""


# ---- evaluation of a model: one agent sample (episode + grade) -------------------------------------


@dataclass(frozen=True)
class EvalSample:
    """One sample of `swerl eval --model`: an agent episode on an instance and the grade of its patch
    (written to `<out>/samples/<instance_id>__<sample>.json`). A sample whose episode failed (sandbox,
    engine or image error: not the model's doing) has `error` set and no grade; a resumed run redoes it."""

    instance_id: str
    """The instance."""
    sample: int
    """Index of the sample (0 .. k-1); sample 0 is the one written to predictions.jsonl."""
    model_name_or_path: str
    """The model (as given to --model)."""
    model_patch: str = ""
    """The patch graded: the submitted one, or the working tree's diff when the episode was truncated."""
    grade: GradeResult | None = None
    """SWE-bench's verdict on `model_patch`; None when the episode failed."""
    error: str = ""
    """Why the episode failed (exception type and message); empty when it ran."""
    error_kind: str = ""
    """`image`, `sandbox`, `engine`, `grading` or `harness`; empty when the episode ran."""
    stop_reason: str = ""
    """How the episode ended: `submit`, or the truncation reason (`max_turns`, `max_new_tokens`, ...)."""
    truncated: bool = False
    """The episode ended by a limit rather than by submitting."""
    turns: int = 0
    """Model turns."""
    tool_calls: int = 0
    """Well-formed tool calls executed."""
    malformed: int = 0
    """Turns that could not be parsed into a valid call."""
    prompt_tokens: int = 0
    """Tokens of the initial prompt."""
    generated_tokens: int = 0
    """Tokens the model sampled, over all turns."""
    total_tokens: int = 0
    """Prompt + generated + observation tokens of the final sequence."""
    episode_s: float = 0.0
    """Seconds of the episode (sandbox start to the end of the last turn)."""
    grade_s: float = 0.0
    """Seconds grading the patch (0 for an empty patch: SWE-bench does not run those)."""

    @property
    def ok(self) -> bool:
        """The episode ran and its patch has a grade."""
        return self.grade is not None and not self.error

    @property
    def resolved(self) -> bool:
        return self.grade is not None and self.grade.resolved

    def to_json(self) -> str:
        import dataclasses
        import json

        d = dataclasses.asdict(self)
        d["grade"] = None if self.grade is None else json.loads(self.grade.to_json())
        return json.dumps(d, indent=1, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> EvalSample:
        import json

        d = json.loads(text)
        g = d.pop("grade")
        return cls(**d, grade=None if g is None else GradeResult.from_json(json.dumps(g)))
