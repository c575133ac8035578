"""What `swerl eval` produces: the summary of a graded predictions file (`EvalSummary`) and one agent
sample of `swerl eval model` (`EvalSample`).
"""

from __future__ import annotations

from dataclasses import dataclass

from swerl.envs.swe.types import GradeResult


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
    host: str = ""
    """The cluster's sandbox host the episode ran on (empty on one machine)."""

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
