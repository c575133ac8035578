"""The SWE room's types: a task in SWE-bench's schema (`SWEInstance`), a prediction, the grade of a
patch (`GradeResult`) and how grading runs (`GradingConfig`, the `swe.grading` config section).

They import only the standard library, so the grading container's helpers and the eval side can use them.
"""

from __future__ import annotations

from dataclasses import dataclass


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
