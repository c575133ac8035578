"""The SWE environment: an agent works on a SWE-bench-schema instance in a sandbox of its image;
its patch is graded by SWE-bench's own grading in a *fresh* container, so nothing the agent did
to the working container (edited tests, planted conftest files, killed processes) affects the grade.

    image = resolve_image(instance)
    with DockerSandbox(SandboxSpec(image=image)) as sb:
        env = SWEEnv(sb, instance)
        traj = await run_episode(env, engine, tokenizer)
        grade = env.grade(traj)          # submitted patch, or the working tree's diff if truncated
        reward = grade.reward
"""

from __future__ import annotations

from swerl.agent import DEFAULT_SYSTEM_PROMPT, ToolEnv
from swerl.envs.swe.grading import activation_script, grade_patch, verdict
from swerl.sandbox import Sandbox
from swerl.structs import (
    EnvStart,
    GradeResult,
    GradingConfig,
    ParsedTurn,
    StepResult,
    SWEInstance,
    ToolConfig,
    Trajectory,
)

TASK_TEMPLATE = """<issue>
{problem_statement}
</issue>

The repository is checked out at /testbed (HEAD is commit {head}). Change the non-test source
files so that the issue is resolved; the maintainers' tests will be run on your change. Use the
tools to explore, edit and run code, then call `submit`."""


class TestbedError(RuntimeError):
    """The instance image's test environment is broken (it does not activate)."""

    failure_kind = "environment"


class SWEEnv:
    """`ToolEnv` over the instance's sandbox, plus grading. Reward: 1.0 when SWE-bench would call the
    instance resolved (every FAIL_TO_PASS and PASS_TO_PASS test passes), else 0.0 (or the partial
    reward, when `GradingConfig.partial_reward` is on). When the grading itself fails (no image, a
    container that died), `step` / `grade` raise `GradingFailed`: the episode fails, it scores nothing."""

    def __init__(self, sandbox: Sandbox, instance: SWEInstance, *, grading: GradingConfig | None = None,
                 tools: ToolConfig | None = None, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 image: str | None = None) -> None:
        self.instance = instance
        self.sandbox = sandbox
        self.grading = grading or GradingConfig()
        self.image = image
        # HEAD as the sandbox found it: an image may commit on top of base_commit (swerl's scrub layer does)
        head = getattr(sandbox, "base_commit", None) or instance.base_commit
        task = TASK_TEMPLATE.format(problem_statement=instance.problem_statement.strip(), head=head[:12])
        self._tools = ToolEnv(sandbox, task, system_prompt=system_prompt, config=tools)
        self.action_format = self._tools.action_format
        self.last_grade: GradeResult | None = None

    def reset(self) -> EnvStart:
        """The task; first the agent's shell activates the test environment the way the eval script
        does (its exports persist to every later command). If that fails, the image is broken:
        `TestbedError`, an infrastructure failure of the episode, never a score."""
        self.last_grade = None
        start = self._tools.reset()
        activate = activation_script(self.instance)
        if activate:
            r = self.sandbox.run(" && ".join([*activate.splitlines(), "cd /testbed"]), timeout=120)
            if r.exit_code != 0 or r.timed_out:
                raise TestbedError(f"{self.instance.instance_id}: the test environment did not activate "
                                   f"({activate.splitlines()[-1]!r} exited {r.exit_code}): {r.output.strip()[-300:]}")
        return start

    def step(self, turn: ParsedTurn) -> StepResult:
        step = self._tools.step(turn)
        if not step.terminated:
            return step
        grade = self._grade(step.result)
        return StepResult(observation=step.observation, terminated=True, reward=grade.reward,
                          reason=step.reason, result=step.result)

    def grade(self, trajectory: Trajectory) -> GradeResult:
        """The grade of an episode: of its submitted patch, or — when it was truncated before
        submitting — of the working tree as the agent left it (SWE-bench grades whatever diff
        exists)."""
        if trajectory.terminated and self.last_grade is not None:
            return self.last_grade
        patch = trajectory.result if trajectory.result is not None else self.sandbox.diff()
        return self._grade(patch)

    def _grade(self, patch: str | None) -> GradeResult:
        """The verdict on `patch`; a grading that failed for an infrastructure reason raises GradingFailed
        (the episode fails: it is no reward 0)."""
        self.last_grade = grade_patch(self.instance, patch, config=self.grading, image=self.image)
        return verdict(self.last_grade)
