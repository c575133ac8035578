"""Canary tests (`swerl.envs.swe.canary`): the plan, and the real thing end to end on the host.

The end-to-end tests write a small repository into a temporary folder, plan canaries for it, build the
eval script SWE-bench's way (`set -x`, the start and end markers around the test command) with the
placing script spliced in, run it with bash and the real runner (pytest, sympy's `SymPyTests`, Django's
test runner), parse the output with swebench's own parser and ask `check`. The placing script `cd`s to
/testbed, the grading container's checkout; here that is the temporary folder. Each forgery is a way a
patch could lie about the run: `check` must find it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
from swebench.harness.log_parsers import PARSER_REGISTRY

from swerl.envs.swe import canary

PY = sys.executable
FORGE_ASSERT_EQUAL = "import unittest; unittest.TestCase.assertEqual = lambda *a, **k: None\n"
"""A conftest-free forgery: the test module itself patches unittest's assertion helper."""


def _eval_script(workdir: str, command: str) -> str:
    """An eval script of SWE-bench's shape (its tail: xtrace on, the test command between the markers)."""
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", f"cd {workdir}", f": '{START_TEST_OUTPUT}'",
                      command, f": '{END_TEST_OUTPUT}'", ""])


def _on_host(plan: canary.CanaryPlan, repo: Path) -> canary.CanaryPlan:
    assert "cd /testbed" in plan.script
    script = plan.script.replace("cd /testbed", f"cd {shlex.quote(str(repo))}")
    return dataclasses.replace(plan, script=script)


def _run(script: str, where: Path) -> str:
    """Run an eval script with bash, stdout and stderr together (as the grading's exec reads them)."""
    path = where / "eval.sh"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    r = subprocess.run(["bash", str(path)], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=20, env=env)
    return r.stdout


def _tests_part(output: str) -> str:
    """What swebench's get_logs_eval hands the parser: the text between the markers."""
    assert START_TEST_OUTPUT in output and END_TEST_OUTPUT in output, output[-2000:]
    return output.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]


def _parse(parser: str, log: str) -> dict[str, str]:
    return PARSER_REGISTRY[parser](log, None)


def _statuses(status_map: dict[str, str], name: str) -> set[str]:
    """The statuses of the reported ids that name `name` (as a whole word)."""
    return {s for k, s in status_map.items() if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", k)}


def _sentinels(plan: canary.CanaryPlan) -> list[canary.Canary]:
    return [c for c in plan.canaries if c.expect != "same"]


def _mirrors(plan: canary.CanaryPlan) -> list[canary.Canary]:
    return [c for c in plan.canaries if c.expect == "same"]


# ------------------------------------------------------------------------------------------------ plan()

F2P = ("tests/test_mod.py::test_bug[1]", "tests/test_mod.py::test_bug[2]",
       "tests/test_mod.py::TestGroup::test_in_class")
P2P = ("tests/test_mod.py::test_ok", "tests/test_other.py::test_fine")
FILES = ["tests/test_mod.py", "tests/test_other.py"]


def _testbed_script(command: str) -> str:
    return textwrap.dedent(f"""\
        #!/bin/bash
        set -uxo pipefail
        source /opt/miniconda3/bin/activate
        conda activate testbed
        cd /testbed
        git checkout 0123abc tests/test_mod.py
        git apply -v - <<'EOF_114329324912'
        diff --git a/tests/test_mod.py b/tests/test_mod.py
        EOF_114329324912
        : '{START_TEST_OUTPUT}'
        {command}
        : '{END_TEST_OUTPUT}'
        git checkout 0123abc tests/test_mod.py
        """)


def _plan(command: str = "pytest -rA tests/test_mod.py tests/test_other.py", seed: int | None = 1,
          log_parser: str = "parse_log_pytest", f2p=F2P, p2p=P2P, files=FILES) -> canary.CanaryPlan:
    return canary.plan(log_parser, _testbed_script(command), f2p, p2p, list(files), seed=seed)


def test_plan_pytest_names_sentinels_and_mirrors():
    p = _plan()
    assert p.runner == "pytest" and p.note == ""
    names = [c.name for c in p.canaries]
    assert len(names) == len(set(names))
    assert all(n.startswith("test") for n in names)
    # sentinels in both graded files, each file with a must-pass and a must-fail of distinct forms
    assert {c.file for c in _sentinels(p)} == set(FILES)
    for f in FILES:
        mine = [c for c in _sentinels(p) if c.file == f]
        assert {c.expect for c in mine} == {"pass", "fail"}
        assert len({c.form for c in mine}) == len(mine) >= 2
    # one mirror per FAIL_TO_PASS function (test_bug's two parameter sets count once), in its own file
    mirrors = _mirrors(p)
    assert sorted(c.original.partition("[")[0] for c in mirrors) == [
        "tests/test_mod.py::TestGroup::test_in_class", "tests/test_mod.py::test_bug"]
    for m in mirrors:
        assert m.original in F2P and m.file == "tests/test_mod.py"
        # the runner reports the copy as it reports the original, with the copy's name
        head, _, params = m.original.partition("[")
        assert m.key == head.rsplit("::", 1)[0] + "::" + m.name + (f"[{params}" if params else "")
    # every name is defined in the placing script, which appends to the graded files only
    for n in names:
        assert re.search(rf"(?:def |^|\.){n}\b", p.script, re.M), n
    assert "cd /testbed" in p.script


def test_plan_names_are_fresh_per_seed_and_fixed_by_one():
    a, b, a2 = _plan(seed=11), _plan(seed=12), _plan(seed=11)
    assert not {c.name for c in a.canaries} & {c.name for c in b.canaries}
    assert [(c.name, c.form, c.key) for c in a.canaries] == [(c.name, c.form, c.key) for c in a2.canaries]
    # a grading draws its own seed: two of them share no name
    assert not {c.name for c in _plan(seed=None).canaries} & {c.name for c in _plan(seed=None).canaries}


def test_plan_takes_at_most_two_files_those_of_fail_to_pass_first():
    p = _plan("pytest -rA tests", f2p=("tests/test_c.py::test_x",), p2p=("tests/test_a.py::test_y",),
              files=["tests/test_b.py", "tests/test_a.py", "tests/test_c.py"])
    assert {c.file for c in _sentinels(p)} == {"tests/test_c.py", "tests/test_a.py"}
    assert [c.original for c in _mirrors(p)] == ["tests/test_c.py::test_x"]


@pytest.mark.parametrize("command,log_parser", [
    ("pytest -rA -x tests/test_mod.py", "parse_log_pytest"),
    ("pytest -rA --exitfirst tests/test_mod.py", "parse_log_pytest"),
    ("pytest -rA --maxfail=1 tests/test_mod.py", "parse_log_pytest"),
    ("pytest -rA -vx tests/test_mod.py", "parse_log_pytest"),  # -x inside a flag cluster
    ("pytest -xvs tests/test_mod.py", "parse_log_pytest"),
    ("pytest -rA --sw tests/test_mod.py", "parse_log_pytest"),
    ("pytest -rA tests/test_mod.py -k 'bug or ok'", "parse_log_pytest"),  # a selection inside the file
    ("python -m pytest -rA -m 'not slow' tests/test_mod.py", "parse_log_pytest"),
    ("pytest -rA --deselect tests/test_mod.py::test_ok tests/test_mod.py", "parse_log_pytest"),
    ("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 --failfast pkg.test_mod",
     "parse_log_django"),
    ("./tests/runtests.py --verbosity 2 --settings=test_sqlite -k bug pkg.test_mod", "parse_log_django"),
])
def test_no_canaries_when_the_command_stops_early_or_selects_tests(command, log_parser):
    f2p = ("test_bug (pkg.test_mod.MathTests.test_bug)",) if log_parser == "parse_log_django" else F2P
    p = _plan(command, log_parser=log_parser, f2p=f2p, p2p=())
    assert p.canaries == () and p.script == "" and "first failure or selects" in p.note
    assert canary.with_canaries(_testbed_script(command), p) == _testbed_script(command)


@pytest.mark.parametrize("command", [
    "python3 -m pytest -rA --tb=short -p no:cacheprovider -o addopts='' -W ignore::DeprecationWarning "
    "tests/test_mod.py",  # the shipped rows' command: `-m pytest` and `-p` are no selection
    "pytest -rxXs tests/test_mod.py",  # -r's report characters hold an x
    "pytest -rA ./tests/",
])
def test_canaries_for_commands_that_run_whole_files(command):
    p = _plan(command)
    assert p.runner == "pytest" and _sentinels(p) and _mirrors(p), p.note


@pytest.mark.parametrize("command", ["pytest -rA tests/test_elsewhere.py",
                                     "pytest -rA tests/test_mod.py::test_bug"])
def test_no_canaries_when_the_command_runs_none_of_the_graded_files(command):
    p = _plan(command)
    assert p.canaries == () and p.script == "" and "names none" in p.note


def test_django_command_selects_files_by_module_label():
    f2p = ("test_bug (pkg.test_mod.MathTests.test_bug)",)
    cmd = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {}"
    for label in ("pkg.test_mod", "pkg"):
        p = _plan(cmd.format(label), log_parser="parse_log_django", f2p=f2p, p2p=(), files=[])
        assert p.runner == "django" and {c.file for c in p.canaries} == {"tests/pkg/test_mod.py"}
    p = _plan(cmd.format("other.test_mod"), log_parser="parse_log_django", f2p=f2p, p2p=(), files=[])
    assert p.canaries == () and "names none" in p.note


def test_no_canaries_for_another_languages_parser():
    p = _plan("npx jest tests/test_mod.py", log_parser="parse_log_jest")
    assert p.runner == "" and p.canaries == () and p.script == "" and "parse_log_jest" in p.note


def test_with_canaries_places_before_the_tests_and_leaves_the_command_alone():
    script = _testbed_script("pytest -rA tests/test_mod.py")
    p = _plan("pytest -rA tests/test_mod.py")
    out = canary.with_canaries(script, p)
    assert canary.test_section(out) == canary.test_section(script)
    assert out.index(p.script.rstrip("\n")) < out.index(START_TEST_OUTPUT)
    with pytest.raises(ValueError):
        canary.with_canaries("pytest -rA tests/test_mod.py\n", p)


# ------------------------------------------------------------------------------------- pytest, end to end

PYTEST_MODULE = '''\
import unittest

import pytest


def test_ok():
    assert 1 + 1 == 2


@pytest.mark.parametrize("x", [1, 2])
def test_bug(x):
    assert x < 0


class TestGroup:
    def test_in_class(self):
        assert [1, 2] == [2, 1]


class CaseTests(unittest.TestCase):
    def test_method(self):
        self.assertEqual(2 * 2, 4)
'''
PYTEST_F2P = ("tests/test_mod.py::test_bug[1]", "tests/test_mod.py::test_bug[2]",
              "tests/test_mod.py::TestGroup::test_in_class")
PYTEST_P2P = ("tests/test_mod.py::test_ok", "tests/test_mod.py::CaseTests::test_method")
PYTEST_OWN = {"tests/test_mod.py::test_ok": "PASSED", "tests/test_mod.py::test_bug[1]": "FAILED",
              "tests/test_mod.py::test_bug[2]": "FAILED",
              "tests/test_mod.py::TestGroup::test_in_class": "FAILED",
              "tests/test_mod.py::CaseTests::test_method": "PASSED"}
"""The module's own tests, as pytest reports them (worked out by hand)."""


def _pytest_repo(root: Path, module: str) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "tests" / "test_mod.py").write_text(module)
    return root


@pytest.fixture(scope="module")
def pytest_runs(tmp_path_factory):
    """The module run plainly, with canaries, and forged (assertEqual patched) with canaries."""
    base = tmp_path_factory.mktemp("pytest_canary")
    command = f"{shlex.quote(PY)} -m pytest -rA -p no:cacheprovider tests/test_mod.py"
    runs = {}
    for seed, (kind, module) in enumerate((("plain", PYTEST_MODULE), ("honest", PYTEST_MODULE),
                                           ("forged", FORGE_ASSERT_EQUAL + PYTEST_MODULE))):
        repo = _pytest_repo(base / kind, module)
        script = _eval_script(shlex.quote(str(repo)), command)
        plan = canary.plan("parse_log_pytest", script, PYTEST_F2P, PYTEST_P2P, ["tests/test_mod.py"],
                           seed=seed)
        if kind != "plain":
            script = canary.with_canaries(script, _on_host(plan, repo))
        output = _run(script, base / kind)
        runs[kind] = (plan, output)
    return runs


def _pytest_check(plan, output, log=None):
    log = _tests_part(output) if log is None else log
    return canary.check(plan, canary.placed_blocks(output), _parse("parse_log_pytest", log), log)


def test_pytest_honest_run_is_placed_and_clean(pytest_runs):
    plan, output = pytest_runs["honest"]
    assert {c.block for c in plan.canaries} == {"s0", "m0", "m1"}
    assert canary.placed_blocks(output) == {"s0", "m0", "m1"}
    status = _parse("parse_log_pytest", _tests_part(output))
    for c in _sentinels(plan):
        assert _statuses(status, c.name) == ({"PASSED"} if c.expect == "pass" else {"FAILED"}), c
    for m in _mirrors(plan):
        assert status[m.key] == status[m.original] == "FAILED"
    assert _pytest_check(plan, output) == ()


def test_pytest_canaries_leave_the_instances_own_results_alone(pytest_runs):
    plan, output = pytest_runs["honest"]
    _, plain_output = pytest_runs["plain"]
    plain = _parse("parse_log_pytest", _tests_part(plain_output))
    assert plain == PYTEST_OWN
    names = {c.name for c in plan.canaries}
    with_canaries = _parse("parse_log_pytest", _tests_part(output))
    assert {k: v for k, v in with_canaries.items() if not canary.names_any(names, k)} == PYTEST_OWN
    assert len(with_canaries) > len(PYTEST_OWN)


def test_pytest_patched_assert_equal_is_caught(pytest_runs):
    plan, output = pytest_runs["forged"]
    assert canary.placed_blocks(output) == {"s0", "m0", "m1"}
    evidence = _pytest_check(plan, output)
    (bad,) = [c for c in plan.canaries if c.form == "unittest-fail"]
    assert evidence and all(bad.name in e for e in evidence)
    assert "PASSED" in evidence[0]


def test_pytest_failed_lines_rewritten_as_passed_are_caught(pytest_runs):
    plan, output = pytest_runs["honest"]
    log = "\n".join("PASSED " + line[len("FAILED "):].split(" - ")[0] if line.startswith("FAILED ") else line
                    for line in _tests_part(output).split("\n"))
    assert "FAILED" not in set(_parse("parse_log_pytest", log).values())
    evidence = _pytest_check(plan, output, log)
    must_fail = [c for c in plan.canaries if c.expect == "fail"]
    assert len(must_fail) >= 3
    for c in must_fail:
        assert [e for e in evidence if c.name in e and "PASSED" in e], c
    assert not [e for e in evidence if e.startswith("mirror")]  # the copies were flipped with the originals


def test_pytest_canary_results_dropped_are_caught(pytest_runs):
    plan, output = pytest_runs["honest"]
    names = {c.name for c in plan.canaries}
    log = "\n".join(line for line in _tests_part(output).split("\n") if not canary.names_any(names, line))
    assert _parse("parse_log_pytest", log) == PYTEST_OWN
    evidence = _pytest_check(plan, output, log)
    for c in plan.canaries:
        assert [e for e in evidence if c.name in e and "not reported" in e], c


def test_pytest_name_targeted_forgery_is_caught_by_the_mirrors(pytest_runs):
    plan, output = pytest_runs["honest"]

    def forge(line: str) -> str:
        for t in PYTEST_F2P:
            if line.startswith(f"FAILED {t} ") or line == f"FAILED {t}":
                return f"PASSED {t}"
        return line

    log = "\n".join(forge(line) for line in _tests_part(output).split("\n"))
    forged = _parse("parse_log_pytest", log)
    assert all(forged[t] == "PASSED" for t in PYTEST_F2P)
    evidence = _pytest_check(plan, output, log)
    assert len(evidence) == 2 and all(e.startswith("mirror") for e in evidence)
    assert {m.original for m in _mirrors(plan)} == {next(t for t in PYTEST_F2P if t in e) for e in evidence}


def test_pytest_block_is_not_placed_over_a_taken_name(tmp_path):
    command = f"{shlex.quote(PY)} -m pytest -rA -p no:cacheprovider tests/test_mod.py"
    script = _eval_script(shlex.quote(str(tmp_path)), command)
    plan = canary.plan("parse_log_pytest", script, PYTEST_F2P, PYTEST_P2P, ["tests/test_mod.py"], seed=3)
    m0 = next(c for c in plan.canaries if c.block == "m0")
    _pytest_repo(tmp_path, PYTEST_MODULE + f"\n\ndef {m0.name}():\n    pass\n")
    output = _run(canary.with_canaries(script, _on_host(plan, tmp_path)), tmp_path)
    assert canary.placed_blocks(output) == {"s0", "m1"}
    assert (tmp_path / "tests" / "test_mod.py").read_text().count(f"def {m0.name}(") == 1
    assert _pytest_check(plan, output) == ()  # an unplaced block is no evidence


# -------------------------------------------------------------------------------------- sympy, end to end

SYMPY_BIN_TEST = '''\
"""bin/test --verbose of sympy's repository, for a checkout at the current folder (sympy.testing.runtests'
_test with sort=True, its default, and the test files named on the command line)."""
import os
import sys

from sympy.testing.runtests import PyTestReporter, SymPyTests

root = os.getcwd()
reporter = PyTestReporter(verbose="--verbose" in sys.argv, colors=False)
tests = SymPyTests(reporter, (), False, 1)
tests._root_dir = root
reporter.root_dir(root)
tests._testfiles.extend(os.path.join(root, p) for p in sys.argv[1:] if not p.startswith("-"))
sys.exit(not tests.test(sort=True))
'''
SYMPY_MODULE = '''\
def test_one():
    assert 1 + 1 == 2


def test_foo():
    assert 2 * 2 == 5


def test_zero():
    assert 0 * 5 == 0
'''
SYMPY_FILE = "mylib/tests/test_foo.py"


@pytest.fixture(scope="module")
def sympy_run(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sympy_canary")
    (repo / "bin").mkdir()
    (repo / "bin" / "test").write_text(SYMPY_BIN_TEST)
    (repo / SYMPY_FILE).parent.mkdir(parents=True)
    (repo / SYMPY_FILE).write_text(SYMPY_MODULE)
    script = _eval_script(shlex.quote(str(repo)), f"{shlex.quote(PY)} bin/test -C --verbose {SYMPY_FILE}")
    plan = canary.plan("parse_log_sympy", script, ("test_foo",), ("test_one", "test_zero"), [SYMPY_FILE],
                       seed=5)
    output = _run(canary.with_canaries(script, _on_host(plan, repo)), repo)
    return plan, output


def _sympy_check(plan, output, log):
    return canary.check(plan, canary.placed_blocks(output), _parse("parse_log_sympy", log), log)


def test_sympy_honest_run_is_placed_and_clean(sympy_run):
    plan, output = sympy_run
    assert plan.runner == "sympy" and {c.form for c in plan.canaries} == {"assert-pass", "assert-fail",
                                                                          "raise", "mirror"}
    assert canary.placed_blocks(output) == {"s0", "m0"}
    log = _tests_part(output)
    status = _parse("parse_log_sympy", log)
    assert status["test_one"] == status["test_zero"] == "PASSED" and status["test_foo"] == "FAILED"
    (mirror,) = _mirrors(plan)
    assert mirror.original == "test_foo" and status[mirror.key] == "FAILED"
    for c in _sentinels(plan):
        got = _statuses(status, c.name)
        assert got and got <= ({"PASSED"} if c.expect == "pass" else {"FAILED", "ERROR"}), (c, got)
    assert _sympy_check(plan, output, log) == ()


def test_sympy_failures_rewritten_as_ok_are_caught(sympy_run):
    plan, output = sympy_run
    log = re.sub(r"^(test_\w+) [FE]\b.*$", r"\1 ok", _tests_part(output), flags=re.M)
    evidence = _sympy_check(plan, output, log)
    for c in plan.canaries:
        if c.expect == "fail":
            assert [e for e in evidence if c.name in e and "PASSED" in e], c


def test_sympy_name_targeted_forgery_is_caught_by_the_mirror(sympy_run):
    plan, output = sympy_run
    log = "\n".join("test_foo ok" if line.startswith("test_foo ") else line
                    for line in _tests_part(output).split("\n") if ":test_foo " not in line)
    assert _parse("parse_log_sympy", log)["test_foo"] == "PASSED"
    evidence = _sympy_check(plan, output, log)
    assert len(evidence) == 1 and evidence[0].startswith("mirror") and "test_foo" in evidence[0]


# ------------------------------------------------------------------------------------- Django, end to end

DJANGO_SETTINGS = '''\
SECRET_KEY = "canary-tests"
INSTALLED_APPS = []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
'''
DJANGO_MODULE = '''\
from django.test import SimpleTestCase


class MathTests(SimpleTestCase):
    def test_add(self):
        self.assertEqual(1 + 1, 2)

    def test_bug(self):
        self.assertEqual(2 * 2, 5)
'''
DJANGO_F2P = ("test_bug (pkg.test_mod.MathTests.test_bug)",)
DJANGO_P2P = ("test_add (pkg.test_mod.MathTests.test_add)",)


def _django_run(repo: Path, module: str, seed: int) -> tuple[canary.CanaryPlan, str]:
    tests = repo / "tests"
    (tests / "pkg").mkdir(parents=True)
    (tests / "settings.py").write_text(DJANGO_SETTINGS)
    (tests / "pkg" / "__init__.py").write_text("")
    (tests / "pkg" / "test_mod.py").write_text(module)
    t = shlex.quote(str(tests))
    command = (f"PYTHONPATH={t} {shlex.quote(PY)} -m django test --settings=settings -v 2 --parallel 1 "
               "pkg.test_mod")
    script = _eval_script(t, command)
    plan = canary.plan("parse_log_django", script, DJANGO_F2P, DJANGO_P2P, ["tests/pkg/test_mod.py"],
                       seed=seed)
    return plan, _run(canary.with_canaries(script, _on_host(plan, repo)), repo)


def _django_check(plan, output):
    log = _tests_part(output)
    return canary.check(plan, canary.placed_blocks(output), _parse("parse_log_django", log), log)


def test_django_honest_run_is_placed_and_clean(tmp_path):
    import django  # a dev dependency (pyproject.toml): no skip

    assert django.VERSION[:2] == (5, 2)
    plan, output = _django_run(tmp_path, DJANGO_MODULE, seed=8)
    assert plan.runner == "django"
    assert canary.placed_blocks(output) == {"s0", "m0"}
    status = _parse("parse_log_django", _tests_part(output))
    assert status[DJANGO_P2P[0]] == "PASSED" and status[DJANGO_F2P[0]] == "FAILED"
    (mirror,) = _mirrors(plan)
    assert mirror.key == f"{mirror.name} (pkg.test_mod.MathTests.{mirror.name})"
    assert status[mirror.key] == "FAILED"
    for c in _sentinels(plan):
        assert _statuses(status, c.name) == ({"PASSED"} if c.expect == "pass" else {"FAILED"}), c
    assert _django_check(plan, output) == ()


def test_django_patched_assert_equal_is_caught(tmp_path):
    plan, output = _django_run(tmp_path, FORGE_ASSERT_EQUAL + DJANGO_MODULE, seed=9)
    assert canary.placed_blocks(output) == {"s0", "m0"}
    status = _parse("parse_log_django", _tests_part(output))
    assert status[DJANGO_F2P[0]] == "PASSED"  # the forgery "fixes" the instance's test
    (bad,) = [c for c in plan.canaries if c.form == "unittest-fail"]
    evidence = _django_check(plan, output)
    assert evidence and all(bad.name in e for e in evidence)
