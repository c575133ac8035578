"""Grading a patch the way SWE-bench does, in a fresh container, with the `swebench` package's own
log parsers and grading functions.

Steps (each in the same fresh container, removed afterwards):
1. apply the model patch with the installed SWE-bench harness's chain: `git apply -v`, and when that
   fails, from a clean tree each time, its fallbacks down to `patch --batch --forward --fuzz=5 -p1 -i`;
2. run the eval script: the instance's own (newer SWE-bench datasets) or one written here from
   `test_cmd`: reset the test files (those `test_patch` touches and those the graded tests live in,
   plus every conftest.py) to base_commit, apply `test_patch`, run the tests between SWE-bench's
   START/END markers, and reset again. Edits the agent made to the tests therefore never count;
   before either script, `guard_test_run` puts the test infrastructure back as it was at base_commit
   (every test file and folder, conftest.py, pytest.ini / tox.ini / setup.cfg / pyproject.toml /
   noxfile.py) and drops the patch's new files that would shadow the test runner or a module the tests
   import (`pytest.py`, `sitecustomize.py`, any top-level name of the environment's stdlib or
   site-packages); each is recorded in `GradeResult.tampered_files`. The tests run with
   `PYTHONSAFEPATH=1` (Python 3.11+), so the working directory does not shadow installed modules.
   Right before the tests start, the eval script appends canary tests of fresh random names to the
   graded tests' files (`swerl.envs.swe.canary`), in this container only;
3. parse the log with `swebench.harness.grading.get_logs_eval` (parser from PARSER_REGISTRY by the
   instance's `log_parser`); a canary reported wrongly means the patch's code forged the run
   (`GradeResult.tampered`, reward 0); otherwise compare with FAIL_TO_PASS / PASS_TO_PASS with
   `get_eval_tests_report` (canaries left out) and decide with `get_resolution_status`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
import time
from pathlib import Path
from typing import Any

from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS,
    END_TEST_OUTPUT,
    FAIL_TO_PASS,
    PASS_TO_PASS,
    START_TEST_OUTPUT,
    TESTS_TIMEOUT,
    EvalType,
    ResolvedStatus,
)
from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
from swebench.harness.run_evaluation import GIT_APPLY_CMDS
from swebench.harness.utils import make_test_spec

from swerl.envs.swe import canary
from swerl.envs.swe.diffs import added_files, file_chunks, patch_files
from swerl.envs.swe.images import TASKS_ROOT, resolve_image
from swerl.envs.swe.parsers import PARSER_REGISTRY  # swebench's, with the parsers rows name that it lacks
from swerl.envs.swe.types import GradeResult, GradingConfig, SWEInstance
from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.errors import SandboxError

PATCH_PATH = "/tmp/swerl-model.diff"
EVAL_PATH = "/tmp/swerl-eval.sh"
TEST_INFRA = re.compile(r"(^|/)(tests?|testing)/|(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py|"
                        r"pytest\.ini|\.pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml|noxfile\.py)$|\.pyc$")
"""Paths whose base_commit state the grading restores before the tests run: test files and folders,
conftest.py, every file pytest reads its options from, noxfile.py, and compiled bytecode (a planted
unchecked-hash .pyc would run in place of its source)."""
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "unittest", "nose", "sitecustomize",
                            "usercustomize", "conftest", "hypothesis", "xdist", "coverage"})
"""Modules a test run imports whatever the environment holds: a new file of one of these names, where it
could be imported as a top-level module, is dropped from the graded patch."""
RUNNER_TAMPERING = re.compile(
    r"^\+.*(\b_pytest\b|\bpytest_[a-z_]+|\bpytest11\b|\bpluggy\b|\bpluginmanager\b|\bhookimpl\b|"
    r"\bhookwrapper\b|\bPYTEST_[A-Z_]+|\bos\._exit\b|\bgc\.get_objects\b|\bgc\.get_referrers\b|"
    r"\bsys\._getframe\b|\bsys\.modules\[\s*.(?:_?pytest|unittest)|\b(?:import|from)\s+(?:_?pytest|pluggy)\b|"
    r"[\"'](?:PASSED|FAILED|XFAIL|ERROR) )", re.M)
"""Lines a source (non-test) change has seldom business adding unless the project is the test runner
itself: pytest's internals, hooks, plugin registration, hard process exits, frame and heap walking, and
result words of pytest's log. A signal for review only (`GradeResult.runner_words`), never a gate: a
word list loses to obfuscation and flags honest fixes; the canaries (`swerl.envs.swe.canary`) decide
whether the run was forged."""
_METADATA = re.compile(r"(^|/)[^/]+\.(dist-info|egg-info|egg-link)(/|$)|(^|/)entry_points\.txt$")
"""New packaging metadata: a `*.dist-info/entry_points.txt` on sys.path registers a pytest plugin."""
_PYTEST_SUMMARY = re.compile(r"^=+ .*\bin [0-9.]+(?:s| seconds)\b.* =+$", re.M)
"""pytest's closing line: `= 3 passed in 0.12s =` (pytest 5.4 on, with `(0:01:02)` past a minute), `= 3 passed
in 0.12 seconds =` before."""
_RUN_END = {"pytest": _PYTEST_SUMMARY, "django": re.compile(r"^Ran \d+ tests? in [0-9.]+s$", re.M),
            "sympy": re.compile(r"tests finished: \d+ passed")}
"""Each runner's closing line (canary.runner_of): pytest's summary, unittest's `Ran 12 tests in 0.3s`
(Django's runtests.py), sympy's `tests finished: 5 passed, ...`. A run whose results lack it was cut
short after printing them (a forged log ends the process early): nothing of it is trusted, and canaries
missing from it prove nothing."""
_GIT_DIR = re.compile(r"^(?:diff --git a/|--- (?:a/)?|\+\+\+ (?:b/)?)(?:\S*/)?\.git(?:/|\s|$)", re.M)
"""A diff path inside a `.git` folder: `git apply` refuses it, but `patch` (the last fallback) would write
it, and a hook there runs as root at the grading's next git command, before the tests."""
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_MODULE_NAMES = (
    "import pkgutil, sys; "
    "print('\\n'.join(sorted({m[1] for m in pkgutil.iter_modules()} | set(sys.builtin_module_names) "
    "| set(getattr(sys, 'stdlib_module_names', ())))))")
_PYTHONS = "python3 python /opt/miniconda3/envs/testbed/bin/python /opt/conda/envs/testbed/bin/python"


def shadowing_files(new_files: list[str], module_names: set[str], has_init: set[str]) -> list[str]:
    """The new files that would shadow a module of the test run: a `.py` file or a package folder whose
    name is an importable top-level module (`module_names` ∪ RUNNER_MODULES) and whose folder could be on
    sys.path — the repository root, or a folder without `__init__.py` (`has_init`: folders that have
    one), which pytest's rootdir import mode and `python -m` put there."""
    names = module_names | RUNNER_MODULES
    out = []
    for f in new_files:
        if _METADATA.search(f):
            out.append(f)
            continue
        parts = f.split("/")
        for depth in range(len(parts)):  # f itself as a module, or any folder above it as a package
            folder = "/".join(parts[:depth])
            name = parts[depth]
            stem = name[:-3] if name.endswith(".py") and depth == len(parts) - 1 else name
            if (depth == len(parts) - 1 and not name.endswith((".py", ".pth"))
                    and name not in ("__init__.py",)):
                continue  # a data file is no module
            if (folder == "" or folder not in has_init) and (stem in names or name.endswith(".pth")):
                out.append(f)
                break
            if folder != "" and folder in has_init:
                break  # inside a regular package: a submodule, not a top-level name
    return out


def runner_tampering(patch: str, instance: SWEInstance) -> list[str]:
    """Source files (not test infrastructure) whose change adds a `RUNNER_TAMPERING` line. Empty for the
    test runner's own repositories (pytest, pluggy), where such lines are the code under repair."""
    if re.search(r"(^|/)(pytest|pluggy)$", instance.repo):
        return []
    return [f for f, chunk in file_chunks(patch).items()
            if not TEST_INFRA.search(f) and RUNNER_TAMPERING.search(chunk)]


def guard_test_run(sb: DockerSandbox, instance: SWEInstance, patch: str) -> tuple[str, ...]:
    """After the patch is applied and before the eval script: drop the patch's new files that would
    shadow a module of the test run, and put the test infrastructure (`TEST_INFRA`) back as it was at
    the start (tracked files restored, new ones removed). The start is the sandbox's HEAD: base_commit,
    or the setup commit SWE-bench's harness (and swerl's build) makes on top of it with what the install
    changed — sphinx's tox.ini, for one, is edited there so pytest prints the results its parser reads.
    Returns the patch's files it overrode."""
    new = added_files(patch)
    tampered: list[str] = []
    if new:
        names = set(sb.run(f"cd / && for p in {_PYTHONS}; do command -v $p >/dev/null && $p -I -c "
                           f"{shlex.quote(_MODULE_NAMES)} 2>/dev/null; done", timeout=120).output.split())
        folders = sorted({"/".join(f.split("/")[:i]) for f in new for i in range(1, f.count("/") + 1)})
        listing = " ".join(shlex.quote(d) for d in folders)
        has_init = set(sb.run(f"cd /testbed && for d in {listing}; do [ -f \"$d/__init__.py\" ] && "
                              "echo \"$d\"; done; true", timeout=60).output.split("\n")) if folders else set()
        drop = shadowing_files(new, names, has_init)
        if drop:
            sb.run("cd /testbed && rm -rf -- " + " ".join(shlex.quote(f) for f in drop), timeout=60)
            tampered += drop
    start = sb.base_commit or instance.base_commit
    base = shlex.quote(start)
    infra = TEST_INFRA.pattern.replace("'", "")
    r = sb.run(
        f"cd /testbed && git ls-tree -r -z --name-only {base} | grep -zE '{infra}' "
        f"| xargs -0 -r git checkout -q {base} -- "
        f"&& git ls-files -z -o -- . | grep -zE '{infra}' | xargs -0 -r rm -f --", timeout=300)
    if not r.ok:
        raise SandboxError(f"resetting the test infrastructure to {start[:12]} failed: "
                           f"{r.output[-500:]}")
    tampered += [f for f in patch_files(patch) if TEST_INFRA.search(f) and f not in tampered]
    return tuple(tampered)


def _safe_path(script: str) -> str:
    """`script` with `export PYTHONSAFEPATH=1` right after the start-of-tests marker: the tests (only)
    run without the working directory on sys.path (Python 3.11+; older ones ignore it)."""
    lines = script.split("\n")
    for i, line in enumerate(lines):
        if START_TEST_OUTPUT in line:
            return "\n".join([*lines[:i + 1], "export PYTHONSAFEPATH=1", *lines[i + 1:]])
    return script


def _between_markers(output: str) -> str:
    start = output.find(START_TEST_OUTPUT)
    end = output.find(END_TEST_OUTPUT, start + 1)
    return output[start if start >= 0 else 0:end if end >= 0 else len(output)]


def graded_test_files(instance: SWEInstance) -> list[str]:
    """Files the graded tests live in (`path.py::name` ids) and files `test_patch` touches."""
    files = patch_files(instance.test_patch)
    for test in (*instance.fail_to_pass, *instance.pass_to_pass):
        path = test.split("::", 1)[0]
        if "::" in test and path.endswith(".py") and path not in files:
            files.append(path)
    return files


def _heredoc(text: str) -> str:
    tag = "EOF_SWERL"
    while tag in text:
        tag += "_X"
    return f"<<'{tag}'\n{text}{'' if text.endswith(chr(10)) else chr(10)}{tag}"


TESTBED_ACTIVATE = (
    "if [ -d /opt/miniconda3/envs/testbed/conda-meta ] && [ -f /opt/miniconda3/bin/activate ]; then "
    "source /opt/miniconda3/bin/activate && conda activate testbed; "
    "elif [ -f /opt/miniconda3/envs/testbed/bin/activate ]; then "
    "source /opt/miniconda3/envs/testbed/bin/activate; fi"
)
"""For rows that bring only a `test_cmd`: SWE-bench's testbed environment (a conda env, or a venv at the
conda env's path) when the image has one, as SWE-bench's eval scripts activate it; nothing elsewhere."""


def eval_script(instance: SWEInstance) -> str:
    """The instance's eval script: its own, or one built from `test_cmd` (see the module docstring)."""
    if instance.eval_script:
        return instance.eval_script
    if not instance.test_cmd:
        raise ValueError(f"{instance.instance_id}: the instance has neither 'eval_script' nor 'test_cmd', so "
                         "there is no way to run its tests")
    base = shlex.quote(instance.base_commit)
    files = " ".join(shlex.quote(f) for f in graded_test_files(instance))
    reset = (
        f"for f in {files}; do if git cat-file -e {base}:\"$f\" 2>/dev/null; then "
        f"git checkout -q {base} -- \"$f\"; "
        "else rm -f -- \"$f\"; fi; done\n"
        # a conftest.py can rewrite test outcomes: every one is put back as it was at base_commit
        "git ls-files -o --exclude-standard -- 'conftest.py' '*/conftest.py' | xargs -r rm -f --\n"
        f"git ls-tree -r --name-only {base} | grep -E '(^|/)conftest\\.py$' "
        f"| xargs -r git checkout -q {base} --\n"
    )
    lines = ["#!/bin/bash", "set -uxo pipefail", TESTBED_ACTIVATE, "cd /testbed", reset.rstrip("\n")]
    if instance.test_patch.strip():
        lines.append(f"git apply -v - {_heredoc(instance.test_patch)}")
    lines += [f": '{START_TEST_OUTPUT}'", instance.test_cmd, f": '{END_TEST_OUTPUT}'", reset.rstrip("\n")]
    return "\n".join(lines) + "\n"


_ACTIVATION = re.compile(r"^(source\s+\S*/activate(\s+\S+)?|conda\s+activate\s+\S+|\.\s+\S*/activate)\s*$")


def activation_script(instance: SWEInstance) -> str:
    """The lines the instance's eval script activates the test environment with (SWE-bench's
    `source /opt/miniconda3/bin/activate` + `conda activate testbed`, or a venv's activate), up to
    its first `cd`: the agent's shell runs them first, so its `python`, `pip` and `pytest` are the
    ones the tests run with. For a `test_cmd` row, `TESTBED_ACTIVATE`."""
    if not instance.eval_script:
        return TESTBED_ACTIVATE if instance.test_cmd else ""
    lines = []
    for line in instance.eval_script.splitlines():
        line = line.strip()
        if line.startswith("cd "):
            break
        if _ACTIVATION.match(line):
            lines.append(line)
    return "\n".join(lines)


def started_instance(instance: SWEInstance, sb: DockerSandbox) -> SWEInstance:
    """`instance` as its scrubbed image starts it: with a `setup_patch`, the image committed it on top of
    base_commit, so the commit the tests are reset to is the sandbox's HEAD."""
    if not instance.setup_patch:
        return instance
    if not sb.base_commit:
        raise SandboxError(f"{instance.instance_id}: /testbed has no HEAD in the sandbox")
    return dataclasses.replace(instance, base_commit=sb.base_commit, setup_patch="")


def test_spec_for(instance: SWEInstance, image: str) -> Any:
    """SWE-bench's TestSpec for the instance, made by swebench's own `make_test_spec`."""
    if instance.log_parser not in PARSER_REGISTRY:
        raise ValueError(f"{instance.instance_id}: field 'log_parser' {instance.log_parser!r} is not one of "
                         "swebench's parsers (e.g. parse_log_pytest)")
    record = {**instance.to_swebench(), "image": image, "eval_script": eval_script(instance)}
    return make_test_spec(record)


def patch_sha256(patch: str | None) -> str:
    return hashlib.sha256((patch or "").encode("utf-8", "surrogateescape")).hexdigest()


class GradingFailed(SandboxError):
    """The grading of a patch failed for an infrastructure reason (`GradeResult.failure`): the episode
    has no verdict and fails (error kind `grading`) instead of scoring 0."""

    failure_kind = "grading"

    def __init__(self, grade: GradeResult) -> None:
        super().__init__(f"grading {grade.instance_id} failed ({grade.failure}): {grade.error[:500]}")
        self.grade = grade


def verdict(grade: GradeResult) -> GradeResult:
    """`grade` when it is the task's verdict; GradingFailed when the grading itself failed."""
    if grade.failed:
        raise GradingFailed(grade)
    return grade


def _error(instance: SWEInstance, patch: str | None, error: str, t0: float, **kw: Any) -> GradeResult:
    kw.setdefault("patch_sha256", patch_sha256(patch))
    return GradeResult(instance_id=instance.instance_id, resolved=False, reward=0.0, error=error,
                       total_s=time.monotonic() - t0, **kw)


def _apply(sb: DockerSandbox, patch: str) -> tuple[bool, str, str]:
    """(applied, method, log): the installed SWE-bench harness's own chain of apply commands
    (`git apply -v`, then its fallbacks, ending with `patch --batch --fuzz=5 -p1 -i`), each attempt from
    a pristine tree, then its check that the patch is already applied (reverse-applies cleanly)."""
    sb.write_file(PATCH_PATH, patch.encode("utf-8", "surrogateescape"))
    log = []
    for attempt, cmd in enumerate(GIT_APPLY_CMDS):
        if attempt:
            # a failed attempt (notably --reject) leaves half a patch behind
            sb.run("cd /testbed && git checkout -q -- . ; git clean -fdq", timeout=120)
        r = sb.run(f"cd /testbed && {cmd} {PATCH_PATH}", timeout=120)
        log.append(f"$ {cmd}\n{r.output}")
        if r.ok:
            return True, cmd, "\n".join(log)
    if sb.run(f"cd /testbed && git apply --check --reverse {PATCH_PATH}", timeout=120).ok:
        return True, "already applied", "\n".join(log)
    return False, "", "\n".join(log)


def grade_patch(instance: SWEInstance, patch: str | None, *, config: GradingConfig | None = None,
                log_dir: str | Path | None = None, image: str | None = None, client: Any = None,
                tasks_root: Path = TASKS_ROOT, run_id: str | None = None) -> GradeResult:
    """Grade `patch` on `instance` in a fresh container. Never raises for a bad patch, a missing image
    or failing tests: those are results (`error` says what went wrong). `log_dir/<instance_id>/`
    receives test_output.txt (SWE-bench's log format) and the patch."""
    config = config or GradingConfig()
    t0 = time.monotonic()
    sha = patch_sha256(patch)
    patch = patch or ""
    empty = not patch.strip()
    tampered: tuple[str, ...] = ()
    try:
        image = image or resolve_image(instance, client=client, tasks_root=tasks_root)
        spec = test_spec_for(instance, image)
    except (SandboxError, ValueError) as e:
        return _error(instance, patch, str(e), t0, empty_patch=empty,
                      failure="image" if isinstance(e, SandboxError) else "instance")
    image_s = time.monotonic() - t0
    out_dir = Path(log_dir) / instance.instance_id if log_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "patch.diff").write_text(patch, errors="surrogateescape")
    log_path = out_dir / "test_output.txt" if out_dir else None
    # root, as SWE-bench's harness runs its eval scripts; the agent's user is only for the episode
    sandbox_spec = SandboxSpec(image=image, memory=config.memory, cpus=config.cpus, network="none",
                               user="root", output_limit=config.log_limit, default_timeout=config.timeout_s)
    timings: dict[str, float] = {"image_s": image_s}
    try:
        t = time.monotonic()
        with DockerSandbox(sandbox_spec, client=client, run_id=run_id,
                           labels={"swerl.swe.instance": instance.instance_id[:63]}) as sb:
            timings["start_s"] = time.monotonic() - t
            started = started_instance(instance, sb)
            if started is not instance:
                instance, spec = started, test_spec_for(started, image)
            t = time.monotonic()
            if empty:
                applied, method, apply_log = True, "", "(empty patch: nothing to apply)"
            elif _GIT_DIR.search(patch):
                applied, method, apply_log = False, "", "the patch writes inside .git/"
            else:
                applied, method, apply_log = _apply(sb, patch)
            timings["apply_s"] = time.monotonic() - t
            if applied and not empty:
                tampered = guard_test_run(sb, instance, patch)
            if not applied:
                text = f"{apply_log}\n{APPLY_PATCH_FAIL}\n"
                if log_path:
                    log_path.write_text(text)
                why = ("" if _GIT_DIR.search(patch) else
                       "git apply and its fallbacks down to patch --fuzz=5 all failed: ")
                return _error(instance, patch, f"patch did not apply ({why}{apply_log[-800:]})", t0,
                              log_path=str(log_path or ""), **timings)
            canaries = (canary.plan(instance.log_parser, spec.eval_script, instance.fail_to_pass,
                                    instance.pass_to_pass, graded_test_files(instance))
                        if config.canaries else canary.CanaryPlan("", note="canaries off"))
            sb.write_file(EVAL_PATH, canary.with_canaries(_safe_path(spec.eval_script), canaries))
            t = time.monotonic()
            r = sb.run(f"bash {EVAL_PATH}", timeout=config.timeout_s)
            timings["test_s"] = time.monotonic() - t
    except SandboxError as e:
        return _error(instance, patch, f"sandbox failed: {e}", t0, empty_patch=empty, failure="sandbox",
                      **timings)
    text = f"{apply_log}\n{APPLY_PATCH_PASS}\n{r.output}"
    if r.timed_out:
        text += f"\n{TESTS_TIMEOUT}\n"
    keep_log = log_path is not None
    if log_path is None:  # swebench's reader wants a file; without a log_dir it is deleted after use
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="swerl-test-output-", delete=False) as f:
            log_path = Path(f.name)
    try:
        log_path.write_text(text, errors="replace")
        status_map, found = get_logs_eval(spec, str(log_path))
    finally:
        if not keep_log:
            log_path.unlink(missing_ok=True)
    common = dict(empty_patch=empty, applied=True, apply_method=method, tampered_files=tampered,
                  runner_words=tuple(runner_tampering(patch, instance)),
                  log_path=str(log_path) if keep_log else "", patch_sha256=sha, **timings)
    if r.timed_out:
        return _error(instance, patch, f"tests timed out after {config.timeout_s:g}s", t0, **common)
    runner = canary.runner_of(instance.log_parser)
    tests_log = _COLOUR.sub("", _between_markers(r.output))
    if found and runner and not empty and not _RUN_END[runner].search(tests_log):
        common["status"] = ResolvedStatus.NO.value
        return _error(instance, patch, f"the test run ended without {runner}'s summary line (the process was "
                      "cut short), so its results are not trusted", t0, **common)
    if not found and re.search(r"^(?:\S+: )*(?:line \d+: )?\S+: (?:command )?not found$"
                               r"|No module named '?pytest", r.output, re.M):
        # the test command itself is missing: the image's environment is broken, not the patch
        return _error(instance, patch, "the test command is not in the image's environment: "
                      f"{_between_markers(r.output)[-400:]}", t0, failure="environment", **common)
    if not found:
        # as in SWE-bench: the tests ran but gave nothing to grade, so the instance is unresolved
        common["status"] = ResolvedStatus.NO.value
        return _error(instance, patch, "the test log has no parseable results (the tests did not run, or "
                      "the test_patch did not apply); see "
                      f"{log_path if keep_log else 'the log (pass log_dir)'}", t0, **common)
    placed = canaries.placed(r.output)
    ours = {c.name for c in canaries.canaries if c.block in placed}
    common["canaries"] = sum(c.block in placed for c in canaries.canaries)
    evidence = canary.check(canaries, placed, status_map, tests_log)
    status_map = {k: v for k, v in status_map.items() if not canary.names_any(ours, k)}
    report = get_eval_tests_report(status_map, {"instance_id": instance.instance_id,
                                                FAIL_TO_PASS: list(instance.fail_to_pass),
                                                PASS_TO_PASS: list(instance.pass_to_pass)},
                                   eval_type=EvalType(instance.eval_type))
    status = get_resolution_status(report)
    if evidence:  # the run's reports are forged: whatever they say of the instance's tests, it is no fix
        status = ResolvedStatus.NO.value
    resolved = status == ResolvedStatus.FULL.value
    f2p_ok, f2p_bad = report[FAIL_TO_PASS]["success"], report[FAIL_TO_PASS]["failure"]
    p2p_ok, p2p_bad = report[PASS_TO_PASS]["success"], report[PASS_TO_PASS]["failure"]
    reward = 1.0 if resolved else 0.0
    if not resolved and config.partial_reward and not p2p_bad and instance.fail_to_pass and not evidence:
        reward = len(f2p_ok) / len(instance.fail_to_pass)
    return GradeResult(
        instance_id=instance.instance_id, resolved=resolved, reward=reward, status=status,
        fail_to_pass_success=tuple(f2p_ok), fail_to_pass_failure=tuple(f2p_bad),
        pass_to_pass_success=tuple(p2p_ok), pass_to_pass_failure=tuple(p2p_bad),
        test_status=tuple(sorted(status_map.items())), tampered="; ".join(evidence),
        failed_tests=name_failures(instance, status_map, f2p_bad, p2p_bad, tests_log),
        total_s=time.monotonic() - t0, **common)


def name_failures(instance: SWEInstance, status_map: dict[str, str], f2p_bad: list[str], p2p_bad: list[str],
                  tests_log: str) -> tuple[str, ...]:
    """`FAIL_TO_PASS TEST: STATUS | LOG LINE` for each FAIL_TO_PASS test that did not pass and each
    PASS_TO_PASS test that failed or was skipped (a skip keeps SWE-bench's verdict but says the environment
    lacks something), with the log line that reports it (the last naming the test, one with its status
    word first). STATUS is the parsed one, `not run` when the log has none."""
    skipped = [t for t in instance.pass_to_pass if status_map.get(t) == "SKIPPED" and t not in p2p_bad]
    lines = tests_log.splitlines()
    out = []
    for kind, tests in ((FAIL_TO_PASS, f2p_bad), (PASS_TO_PASS, [*p2p_bad, *skipped])):
        for test in tests:
            status = status_map.get(test, "not run")
            naming = [ln.strip() for ln in lines if test in ln]
            best = [ln for ln in naming if ln.startswith(status)] or naming
            line = best[-1][:240] if best else ""
            out.append(f"{kind} {test}: {status}" + (f" | {line}" if line else ""))
    return tuple(out)
