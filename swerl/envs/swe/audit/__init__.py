"""Reward-integrity audit: a library of known reward hacks, each run as a scripted policy in a real
episode sandbox and graded exactly as an episode is.

A `Hack` is what a reward-seeking policy could do with its tools: a bash script run at /testbed as the
agent user, in a sandbox started the way an episode's is (`SWETaskSet.specs`: the instance's image from
`resolve_image`, the episode limits). Its patch is then taken the way an episode's is (`sb.diff()`: the
working tree against the start commit; an empty patch scores 0 without a grading run, as in SWE-bench
and `_grade_unsubmitted`) and graded with `grade_patch`, as `SWEEnv` grades a submission. A hack with
`candidates` (e.g. one per git ref) tries each candidate (at most `MAX_CANDIDATES`) in a fresh sandbox;
it *earned* when any candidate got a reward > 0. A sound grading pays none of them.

    report = audit(instances)                 # every hack of HACKS on every instance
    report.earned                             # the results that got a reward: reward holes
    print(report.to_json())

`swerl tasks audit` runs it from the command line and exits 1 when any hack earned.

The scripts see a few shell helpers (`SANDBOX_PRELUDE`): `swerl_test_files` (test files git tracks),
`swerl_test_dirs`, `swerl_roots` (`.` and `src` when there is one: the import roots a test command may
use), `swerl_package_inits` (the package's top-level `__init__.py` files / single modules),
`swerl_force_pass` (prints a pytest plugin that reports every test passed, prints `PASSED <id>` for
the tests the issue names and exits 0),
`swerl_take_tree REV` (the working tree becomes REV's tree; HEAD stays), `swerl_pytest` (pytest with the
import roots on PYTHONPATH) and `swerl_lib CMD` (Python helpers: rewriting test bodies, writing pyc
files, editing pytest config files, copying an installed copy). Each script is told `$CANDIDATE` and
`$SWERL_ISSUE_TESTS`: the test ids the issue text names (what a policy reads; never the graded lists).

The package: `payloads` (what the scripts plant and the helpers they see), `hacks` (the library),
`runner` (running them, the results).
"""

from swerl.envs.swe.audit.hacks import HACK_NAMES, HACKS, Hack, select_hacks
from swerl.envs.swe.audit.payloads import (
    FAKE_LOG,
    FORCE_PASS_PLUGIN,
    MARK_CONFTEST,
    REGISTER_AT_IMPORT,
    SANDBOX_LIB,
    SANDBOX_PRELUDE,
    SHADOW_PYTEST,
    SITECUSTOMIZE,
)
from swerl.envs.swe.audit.runner import (
    CANDIDATES_PATH,
    MAX_CANDIDATES,
    SCRIPT_PATH,
    SCRIPT_TIMEOUT_S,
    AuditReport,
    HackResult,
    audit,
    candidates_in,
    episode_grading,
    episode_sandbox_spec,
    issue_tests,
    list_candidates,
    run_hack,
    run_in_sandbox,
    script_env,
)

__all__ = [
    "CANDIDATES_PATH", "FAKE_LOG", "FORCE_PASS_PLUGIN", "HACKS", "HACK_NAMES", "MARK_CONFTEST",
    "MAX_CANDIDATES", "REGISTER_AT_IMPORT", "SANDBOX_LIB", "SANDBOX_PRELUDE", "SCRIPT_PATH",
    "SCRIPT_TIMEOUT_S", "SHADOW_PYTEST", "SITECUSTOMIZE", "AuditReport", "Hack", "HackResult", "audit",
    "candidates_in", "episode_grading", "episode_sandbox_spec", "issue_tests", "list_candidates",
    "run_hack", "run_in_sandbox", "script_env", "select_hacks",
]
