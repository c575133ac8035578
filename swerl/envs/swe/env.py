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

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.agent import DEFAULT_SYSTEM_PROMPT, ToolEnv
from swerl.agent.tools import ToolConfig
from swerl.envs.swe.grading import activation_script, eval_script, grade_patch, patch_sha256, verdict
from swerl.envs.swe.types import GradeResult, GradingConfig, SWEInstance
from swerl.sandbox import Sandbox
from swerl.structs import EnvStart, ParsedTurn, SandboxSpec, StepResult, Trajectory

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
        self.patch = ""
        """The patch `last_grade` is of (evaluation writes it as the sample's prediction)."""
        self._started = False

    def reset(self) -> EnvStart:
        """The task; first the agent's shell activates the test environment the way the eval script
        does (its exports persist to every later command). If that fails, the image is broken:
        `TestbedError`, an infrastructure failure of the episode, never a score."""
        if self._started:
            # the repository holds the last episode's work, and a sandbox is never reused
            raise RuntimeError(f"{self.instance.instance_id}: SWEEnv runs one episode per sandbox; start a "
                               "fresh sandbox (SandboxPool does) for the next")
        self._started = True
        self.last_grade, self.patch = None, ""
        start = self._tools.reset()
        activate = activation_script(self.instance)
        if activate:
            r = self.sandbox.run(" && ".join([*activate.splitlines(), "cd /testbed"]), timeout=120)
            if r.exit_code != 0 or r.timed_out:
                raise TestbedError(f"{self.instance.instance_id}: the test environment did not activate "
                                   f"({activate.splitlines()[-1]!r} exited {r.exit_code}): "
                                   f"{r.output.strip()[-300:]}")
        return start

    def step(self, turn: ParsedTurn) -> StepResult:
        step = self._tools.step(turn)
        if not step.terminated:
            return step
        grade = self._grade(step.result)
        return StepResult(observation=step.observation, terminated=True, reward=grade.reward,
                          reason=step.reason, result=step.result)

    def grade(self, trajectory: Trajectory) -> GradeResult:
        """The grade of an episode: of its submitted patch (graded when it was submitted), or — when it
        was cut by a budget before submitting — of the working tree as the agent left it (SWE-bench
        grades whatever diff exists). An empty diff scores 0 without a grading run (SWE-bench does not
        run empty patches). The one place an unsubmitted tree is graded: the training and evaluation
        finish hook (`swerl.envs.swe.tasks`) call this; `patch` / `last_grade` keep what was graded."""
        if trajectory.terminated and self.last_grade is not None:
            return self.last_grade
        patch = trajectory.result if trajectory.result is not None else self.sandbox.diff()
        if not patch.strip():
            self.patch = patch
            self.last_grade = GradeResult(instance_id=self.instance.instance_id, resolved=False, reward=0.0,
                                          empty_patch=True, patch_sha256=patch_sha256(patch))
            return self.last_grade
        return self._grade(patch)

    def _grade(self, patch: str | None) -> GradeResult:
        """The verdict on `patch`; a grading that failed for an infrastructure reason raises GradingFailed
        (the episode fails: it is no reward 0)."""
        self.patch = patch or ""
        # graded on the daemon the episode ran on (a cluster's sandbox host, not the driver's machine)
        self.last_grade = grade_patch(self.instance, patch, config=self.grading, image=self.image,
                                      client=getattr(self.sandbox, "client", None))
        return verdict(self.last_grade)


@dataclass(frozen=True)
class EnvCheck:
    """Whether an instance's tests run in the agent's own sandbox, before any fix."""

    instance_id: str
    ok: bool
    detail: str
    """One line: what ran, or what went wrong."""
    fail_to_pass_passing: tuple[str, ...] = ()
    """FAIL_TO_PASS tests that already pass (they should fail before the fix)."""
    pass_to_pass_failing: tuple[str, ...] = ()
    """PASS_TO_PASS tests that fail or did not run (they should pass)."""


def test_commands(instance: SWEInstance) -> str:
    """The commands between the eval script's test-output markers: how the tests are run."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    script = eval_script(instance)
    start, end = script.find(START_TEST_OUTPUT), script.find(END_TEST_OUTPUT)
    if start < 0 or end < start:
        raise ValueError(f"{instance.instance_id}: its eval script has no test-output markers")
    return "\n".join(script[start:end].splitlines()[1:-1])


def check_agent_environment(instance: SWEInstance, *, client: Any = None, spec: SandboxSpec | None = None,
                            timeout_s: float = 1800.0) -> EnvCheck:
    """In a sandbox started as an episode's (the scrubbed image, `SWEEnv.reset`, the agent's user and
    shell), apply the test patch and run the instance's test commands: FAIL_TO_PASS must fail and
    PASS_TO_PASS pass, parsed by the instance's SWE-bench log parser. A broken environment (`pytest`
    missing, an env that does not activate) shows up here, before any episode runs in it."""
    import tempfile

    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TestStatus
    from swebench.harness.grading import get_logs_eval

    from swerl.envs.swe.grading import started_instance, test_spec_for
    from swerl.envs.swe.images import resolve_image
    from swerl.envs.swe.scrub import GRADER_ONLY
    from swerl.sandbox import DockerSandbox

    iid = instance.instance_id
    image = resolve_image(instance, client=client)
    with DockerSandbox(dataclasses.replace(spec or SandboxSpec(), image=image), client=client) as sb:
        try:
            SWEEnv(sb, instance).reset()
        except TestbedError as e:
            return EnvCheck(iid, False, str(e))
        instance = started_instance(instance, sb)
        # the tests the image keeps for the grader (R2E-Gym's) are the agent's to run in this check only:
        # the sandbox is thrown away after it
        for path in GRADER_ONLY:
            sb.container.exec_run(["sh", "-c", f"[ ! -e {path} ] || chmod -R a+rX {path}"], user="root")
        if instance.test_patch.strip():
            sb.write_file("/tmp/swerl-test.patch", instance.test_patch)
            r = sb.run("git apply /tmp/swerl-test.patch && rm /tmp/swerl-test.patch", timeout=120)
            if r.exit_code != 0:
                return EnvCheck(iid, False,
                                f"the test patch does not apply in the agent's sandbox: {r.output[-200:]}")
        r = sb.run(test_commands(instance), timeout=timeout_s)
    if r.timed_out:
        return EnvCheck(iid, False, f"the tests did not finish within {timeout_s:g} s in the agent's sandbox")
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(f"{START_TEST_OUTPUT}\n{r.output}\n{END_TEST_OUTPUT}\n")
    try:
        status, found = get_logs_eval(test_spec_for(instance, image), f.name)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if not found:
        return EnvCheck(iid, False,
                        f"no test results in the agent's sandbox (exit {r.exit_code}): {r.output[-200:]}")
    passed = {TestStatus.PASSED.value, TestStatus.XFAIL.value}
    f2p_bad = tuple(t for t in instance.fail_to_pass if status.get(t) in passed)
    p2p_bad = tuple(t for t in instance.pass_to_pass if status.get(t) not in passed)
    ok = not f2p_bad and not p2p_bad
    detail = (f"tests run in the agent's sandbox: {len(instance.fail_to_pass) - len(f2p_bad)}/"
              f"{len(instance.fail_to_pass)} FAIL_TO_PASS fail, {len(instance.pass_to_pass) - len(p2p_bad)}/"
              f"{len(instance.pass_to_pass)} PASS_TO_PASS pass")
    return EnvCheck(iid, ok, detail, f2p_bad, p2p_bad)
