"""Canary tests (`swerl.envs.swe.canary`): the plan, and the real thing end to end on the host.

The end-to-end tests write a small repository into a temporary folder, plan canaries for it, build the
eval script SWE-bench's way (`set -x`, the start and end markers around the test command) with the
placing script spliced in, run it with bash and the real runner (pytest, sympy's `SymPyTests`, Django's
test runner), parse the output with swebench's own parser and ask `check`. The placing script `cd`s to
/testbed, the grading container's checkout; here that is the temporary folder. Each forgery is a way a
patch could lie about the run: `check` must find it (but the one keyed on full test ids, the documented
limit of the decoys).
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


def _decoy_statuses(status_map: dict[str, str], decoy: canary.Canary) -> set[str]:
    """The statuses of the reported ids that name both the decoy's class and its method."""
    return {s for k, s in status_map.items() if canary.names_any({decoy.name}, k)
            and canary.names_any({decoy.method}, k)}


def _sentinels(plan: canary.CanaryPlan) -> list[canary.Canary]:
    return [c for c in plan.canaries if c.form != "decoy"]


def _decoys(plan: canary.CanaryPlan) -> list[canary.Canary]:
    return [c for c in plan.canaries if c.form == "decoy"]


def _decoy_methods(script: str, cls: str) -> list[str]:
    """The methods the placing script defines in the class `cls` (its body: the indented lines after)."""
    m = re.search(rf"^class {cls}\b.*:\n((?:(?:    .*)?\n)*)", script, re.M)
    assert m, cls
    return re.findall(r"^    def (\w+)\(self\):", m.group(1), re.M)


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


def test_plan_pytest_names_sentinels_and_decoys():
    p = _plan()
    assert p.runner == "pytest" and p.note == ""
    names = [c.name for c in _sentinels(p)]
    assert len(names) == len(set(names))
    assert all(n.startswith("test") for n in names)
    # sentinels in both graded files, each file with a must-pass and a must-fail of distinct forms
    assert {c.file for c in _sentinels(p)} == set(FILES)
    for f in FILES:
        mine = [c for c in _sentinels(p) if c.file == f]
        assert {c.expect for c in mine} == {"pass", "fail"}
        assert len({c.form for c in mine}) == len(mine) >= 2
    # one decoy per FAIL_TO_PASS function name (test_bug's two parameter sets count once), all methods of
    # one fresh class in the block of the file the tests live in, named exactly as those functions
    decoys = _decoys(p)
    assert [c.method for c in decoys] == ["test_bug", "test_in_class"]
    (cls,) = {c.name for c in decoys}
    assert cls.startswith("Test") and cls not in names and cls not in {"TestGroup"}
    for d in decoys:
        assert (d.file, d.block, d.form, d.expect) == ("tests/test_mod.py", "s0", "decoy", "fail")
    assert not [c for c in p.canaries if c.file == "tests/test_other.py" and c.form == "decoy"]
    # pytest collects a plain class named Test*: no unittest base, which would change how it runs
    assert re.search(rf"^class {cls}:$", p.script, re.M)
    assert _decoy_methods(p.script, cls) == ["test_bug", "test_in_class"]
    # every name is defined in the placing script, which appends to the graded files only
    for n in names:
        assert re.search(rf"(?:def |^|\.){n}\b", p.script, re.M), n
    assert "cd /testbed" in p.script
    # the file's own tests carry the decoys' names: those are no reason not to place the block
    assert not re.search(r"grep[^;]*\btest_(?:bug|in_class)\b", p.script)


def test_plan_takes_at_most_max_decoys_distinct_names_per_file():
    f2p = ("tests/test_mod.py::test_a", "tests/test_mod.py::test_b[x]", "tests/test_mod.py::test_b[y]",
           "tests/test_mod.py::TestK::test_c", "tests/test_mod.py::test_d", "tests/test_mod.py::test_e",
           "tests/test_other.py::test_f")
    p = _plan(f2p=f2p)
    assert canary.MAX_DECOYS == 3
    by_file = {f: [c.method for c in _decoys(p) if c.file == f] for f in FILES}
    assert by_file == {"tests/test_mod.py": ["test_a", "test_b", "test_c"], "tests/test_other.py": ["test_f"]}
    # one class per file, each its own
    classes = {f: {c.name for c in _decoys(p) if c.file == f} for f in FILES}
    assert all(len(v) == 1 for v in classes.values())
    assert classes["tests/test_mod.py"] != classes["tests/test_other.py"]


def test_plan_django_decoys_are_a_testcase_and_sympy_has_none():
    f2p = ("test_bug (pkg.test_mod.MathTests.test_bug)", "test_more (pkg.test_mod.MathTests.test_more)",
           "test_bug (pkg.test_mod.OtherTests.test_bug)")
    p = _plan("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 pkg.test_mod",
              log_parser="parse_log_django", f2p=f2p, p2p=(), files=[])
    decoys = _decoys(p)
    assert [c.method for c in decoys] == ["test_bug", "test_more"]
    (cls,) = {c.name for c in decoys}
    assert all(c.file == "tests/pkg/test_mod.py" and c.expect == "fail" for c in decoys)
    # Django's runner collects unittest.TestCase subclasses only
    assert re.search(rf"^class {cls}\(\w+\.TestCase\):$", p.script, re.M)
    assert _decoy_methods(p.script, cls) == ["test_bug", "test_more"]
    s = _plan("bin/test -C --verbose mylib/tests/test_foo.py", log_parser="parse_log_sympy",
              f2p=("test_foo",), p2p=(), files=["mylib/tests/test_foo.py"])
    assert s.runner == "sympy" and s.canaries and not _decoys(s) and "class " not in s.script


def test_plan_names_are_fresh_per_seed_and_fixed_by_one():
    a, b, a2 = _plan(seed=11), _plan(seed=12), _plan(seed=11)
    assert not {c.name for c in a.canaries} & {c.name for c in b.canaries}
    assert [(c.name, c.form, c.method) for c in a.canaries] == [(c.name, c.form, c.method)
                                                                for c in a2.canaries]
    assert a.script.count("\n") == a2.script.count("\n")
    # the decoys carry the same names whatever the seed; only their class is drawn fresh
    assert [c.method for c in _decoys(a)] == [c.method for c in _decoys(b)] == ["test_bug", "test_in_class"]
    assert {c.name for c in _decoys(a)} != {c.name for c in _decoys(b)}
    # a grading draws its own seed: two of them share no name
    assert not {c.name for c in _plan(seed=None).canaries} & {c.name for c in _plan(seed=None).canaries}


def test_plan_takes_at_most_two_files_those_of_fail_to_pass_first():
    p = _plan("pytest -rA tests", f2p=("tests/test_c.py::test_x",), p2p=("tests/test_a.py::test_y",),
              files=["tests/test_b.py", "tests/test_a.py", "tests/test_c.py"])
    assert {c.file for c in _sentinels(p)} == {"tests/test_c.py", "tests/test_a.py"}
    assert [(c.file, c.method) for c in _decoys(p)] == [("tests/test_c.py", "test_x")]


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
    assert p.runner == "pytest" and _sentinels(p) and _decoys(p), p.note


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
    return canary.check(plan, plan.placed(output), _parse("parse_log_pytest", log), log)


def test_pytest_honest_run_is_placed_and_clean(pytest_runs):
    plan, output = pytest_runs["honest"]
    assert {c.block for c in plan.canaries} == {"s0"}
    assert plan.placed(output) == {"s0"}
    status = _parse("parse_log_pytest", _tests_part(output))
    for c in _sentinels(plan):
        assert _statuses(status, c.name) == ({"PASSED"} if c.expect == "pass" else {"FAILED"}), c
    decoys = _decoys(plan)
    assert [d.method for d in decoys] == ["test_bug", "test_in_class"]
    for d in decoys:
        assert _decoy_statuses(status, d) == {"FAILED"}, d
    # by hand: the decoy is reported as a method of its class, under the FAIL_TO_PASS test's name
    cls = decoys[0].name
    assert status[f"tests/test_mod.py::{cls}::test_bug"] == "FAILED"
    assert status[f"tests/test_mod.py::{cls}::test_in_class"] == "FAILED"
    assert _pytest_check(plan, output) == ()


def test_pytest_canaries_leave_the_instances_own_results_alone(pytest_runs):
    plan, output = pytest_runs["honest"]
    _, plain_output = pytest_runs["plain"]
    plain = _parse("parse_log_pytest", _tests_part(plain_output))
    assert plain == PYTEST_OWN
    names = {c.name for c in plan.canaries}
    with_canaries = _parse("parse_log_pytest", _tests_part(output))
    assert {k: v for k, v in with_canaries.items() if not canary.names_any(names, k)} == PYTEST_OWN
    # the rest is the canaries, one id each (a decoy's names its class)
    assert len(with_canaries) == len(PYTEST_OWN) + len(plan.canaries)


def test_pytest_patched_assert_equal_is_caught(pytest_runs):
    plan, output = pytest_runs["forged"]
    assert plan.placed(output) == {"s0"}
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
    assert len(must_fail) >= 3 and _decoys(plan)
    for c in must_fail:
        what = f"{c.name}.{c.method}" if c.method else c.name
        assert [e for e in evidence if what in e and "PASSED" in e], c
    assert len(evidence) == len(must_fail)


def test_pytest_canary_results_dropped_are_caught(pytest_runs):
    plan, output = pytest_runs["honest"]
    names = {c.name for c in plan.canaries}
    log = "\n".join(line for line in _tests_part(output).split("\n") if not canary.names_any(names, line))
    assert _parse("parse_log_pytest", log) == PYTEST_OWN
    evidence = _pytest_check(plan, output, log)
    for c in plan.canaries:
        assert [e for e in evidence if c.name in e and "not reported" in e], c


def _flip(output: str, flips) -> str:
    """The log with each `FAILED <id> ...` line whose id `flips` turned into `PASSED <id>`."""
    def forge(line: str) -> str:
        m = re.match(r"FAILED (\S+)", line)
        return f"PASSED {m.group(1)}" if m and flips(m.group(1)) else line

    return "\n".join(forge(line) for line in _tests_part(output).split("\n"))


def test_pytest_name_targeted_forgery_is_caught_by_the_decoys(pytest_runs):
    """A forger that knows the FAIL_TO_PASS tests by their function names (an issue text names them) and
    flips every test of those names flips the decoys too: they must fail."""
    plan, output = pytest_runs["honest"]
    f2p_names = {t.partition("[")[0].rsplit("::", 1)[1] for t in PYTEST_F2P}
    assert f2p_names == {"test_bug", "test_in_class"}
    log = _flip(output, lambda t: any(re.search(rf"::{n}(\[.*\])?$", t) for n in f2p_names))
    forged = _parse("parse_log_pytest", log)
    assert all(forged[t] == "PASSED" for t in PYTEST_F2P)
    decoys = _decoys(plan)
    assert all(_decoy_statuses(forged, d) == {"PASSED"} for d in decoys)
    evidence = _pytest_check(plan, output, log)
    assert len(evidence) == len(decoys) == 2
    for d, e in zip(decoys, evidence, strict=True):
        assert f"{d.name}.{d.method}" in e and "(decoy, must fail)" in e and e.endswith(": PASSED"), e


def test_pytest_forgery_keyed_on_full_ids_spares_the_decoys(pytest_runs):
    """The known limit (canary.py's docstring): a forger keyed on the FAIL_TO_PASS tests' full ids (file,
    class, name and parameters), not on their names, flips only those and leaves the decoys failing, as
    an honest run does: nothing tells it from an honest fix."""
    plan, output = pytest_runs["honest"]
    log = _flip(output, lambda t: t in PYTEST_F2P)
    forged = _parse("parse_log_pytest", log)
    assert all(forged[t] == "PASSED" for t in PYTEST_F2P)
    assert all(_decoy_statuses(forged, d) == {"FAILED"} for d in _decoys(plan))
    assert _pytest_check(plan, output, log) == ()


def test_pytest_block_is_not_placed_over_a_taken_name(tmp_path):
    command = f"{shlex.quote(PY)} -m pytest -rA -p no:cacheprovider tests/test_mod.py tests/test_other.py"
    script = _eval_script(shlex.quote(str(tmp_path)), command)
    p2p = (*PYTEST_P2P, "tests/test_other.py::test_fine")
    files = ["tests/test_mod.py", "tests/test_other.py"]
    plan = canary.plan("parse_log_pytest", script, PYTEST_F2P, p2p, files, seed=3)
    assert {c.block for c in plan.canaries} == {"s0", "s1"}
    (cls,) = {c.name for c in _decoys(plan)}
    # the file defines the decoys' class name already (its test names, which the decoys carry, are no
    # obstacle: the other file's block is placed beside its test_fine, the FAIL_TO_PASS file's is not)
    _pytest_repo(tmp_path, PYTEST_MODULE + f"\n\nclass {cls}:\n    pass\n")
    (tmp_path / "tests" / "test_other.py").write_text("def test_fine():\n    pass\n")
    output = _run(canary.with_canaries(script, _on_host(plan, tmp_path)), tmp_path)
    assert plan.placed(output) == {"s1"}
    assert (tmp_path / "tests" / "test_mod.py").read_text() == PYTEST_MODULE + f"\n\nclass {cls}:\n    pass\n"
    status = _parse("parse_log_pytest", _tests_part(output))
    assert {k: v for k, v in status.items() if k.startswith("tests/test_mod.py::")} == PYTEST_OWN
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
    return canary.check(plan, plan.placed(output), _parse("parse_log_sympy", log), log)


def test_sympy_honest_run_is_placed_and_clean(sympy_run):
    plan, output = sympy_run
    # sympy's runner collects no classes: sentinels only, no decoys
    assert plan.runner == "sympy" and {c.form for c in plan.canaries} == {"assert-pass", "assert-fail",
                                                                          "raise"}
    assert not _decoys(plan)
    assert plan.placed(output) == {"s0"}
    log = _tests_part(output)
    status = _parse("parse_log_sympy", log)
    assert status["test_one"] == status["test_zero"] == "PASSED" and status["test_foo"] == "FAILED"
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


def test_sympy_forgery_flipping_all_failures_is_caught(sympy_run):
    """A cleaner forgery than the one above: every failing test's line reads ok and the failure reports'
    headers are gone, so the parser reports every test PASSED; the must-fail sentinels say so."""
    plan, output = sympy_run
    lines = [re.sub(r"^(test_\w+) [FE]\b.*$", r"\1 ok", line) for line in _tests_part(output).split("\n")
             if not re.search(r"\.py::?test_\w+ _", line)]  # `file.py:name` (an error), `file.py::name`
    log = "\n".join(lines)
    forged = _parse("parse_log_sympy", log)
    assert forged["test_foo"] == "PASSED" and set(forged.values()) == {"PASSED"}
    evidence = _sympy_check(plan, output, log)
    must_fail = [c for c in plan.canaries if c.expect == "fail"]
    assert len(evidence) == len(must_fail) == 2
    for c in must_fail:
        assert [e for e in evidence if c.name in e and e.endswith(": PASSED")], c


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
DJANGO_OWN = {DJANGO_P2P[0]: "PASSED", DJANGO_F2P[0]: "FAILED", "test_bug": "FAILED"}
"""The module's own tests, as Django's runner reports them (worked out by hand; swebench's parser also
reads the bare name of each `FAIL: name (...)` header)."""


def _django_repo(repo: Path, module: str) -> None:
    tests = repo / "tests"
    (tests / "pkg").mkdir(parents=True)
    (tests / "settings.py").write_text(DJANGO_SETTINGS)
    (tests / "pkg" / "__init__.py").write_text("")
    (tests / "pkg" / "test_mod.py").write_text(module)


def _django_command(tests: Path) -> str:
    t = shlex.quote(str(tests))
    return (f"PYTHONPATH={t} {shlex.quote(PY)} -m django test --settings=settings -v 2 --parallel 1 "
            "pkg.test_mod")


def _django_run(repo: Path, module: str, seed: int) -> tuple[canary.CanaryPlan, str]:
    tests = repo / "tests"
    _django_repo(repo, module)
    script = _eval_script(shlex.quote(str(tests)), _django_command(tests))
    plan = canary.plan("parse_log_django", script, DJANGO_F2P, DJANGO_P2P, ["tests/pkg/test_mod.py"],
                       seed=seed)
    return plan, _run(canary.with_canaries(script, _on_host(plan, repo)), repo)


def _django_check(plan, output):
    log = _tests_part(output)
    return canary.check(plan, plan.placed(output), _parse("parse_log_django", log), log)


def test_django_honest_run_is_placed_and_clean(tmp_path):
    import django  # a dev dependency (pyproject.toml): no skip

    assert django.VERSION[:2] == (5, 2)
    plan, output = _django_run(tmp_path, DJANGO_MODULE, seed=8)
    assert plan.runner == "django"
    assert plan.placed(output) == {"s0"}
    status = _parse("parse_log_django", _tests_part(output))
    assert status[DJANGO_P2P[0]] == "PASSED" and status[DJANGO_F2P[0]] == "FAILED"
    (decoy,) = _decoys(plan)
    assert decoy.method == "test_bug" and decoy.expect == "fail"
    # by hand: the decoy is a method of its own TestCase, reported under the FAIL_TO_PASS test's name
    assert status[f"test_bug (pkg.test_mod.{decoy.name}.test_bug)"] == "FAILED"
    assert _decoy_statuses(status, decoy) == {"FAILED"}
    for c in _sentinels(plan):
        assert _statuses(status, c.name) == ({"PASSED"} if c.expect == "pass" else {"FAILED"}), c
    # the instance's own tests are reported as without canaries; the rest is the canaries, one full id each
    # (and the bare names of the failing sentinels' `FAIL:` headers)
    names = {c.name for c in plan.canaries}
    assert {k: v for k, v in status.items() if not canary.names_any(names, k)} == DJANGO_OWN
    assert len([k for k in status if canary.names_any(names, k) and " (" in k]) == len(plan.canaries)
    assert _django_check(plan, output) == ()


def test_django_canaries_leave_the_instances_own_results_alone(tmp_path):
    tests = tmp_path / "tests"
    _django_repo(tmp_path, DJANGO_MODULE)
    output = _run(_eval_script(shlex.quote(str(tests)), _django_command(tests)), tmp_path)
    assert _parse("parse_log_django", _tests_part(output)) == DJANGO_OWN


def test_django_name_targeted_forgery_is_caught_by_the_decoy(tmp_path):
    plan, output = _django_run(tmp_path, DJANGO_MODULE, seed=10)
    (decoy,) = _decoys(plan)
    log = _tests_part(output)
    # every result line of a test named test_bug reads ok, the decoy's too
    forged_log = re.sub(r"^(test_bug \([\w.]+\)) \.\.\. FAIL$", r"\1 ... ok", log, flags=re.M)
    forged = _parse("parse_log_django", forged_log)
    assert forged[DJANGO_F2P[0]] == "PASSED" and _decoy_statuses(forged, decoy) == {"PASSED"}
    evidence = canary.check(plan, plan.placed(output), forged, forged_log)
    assert len(evidence) == 1 and f"{decoy.name}.test_bug (decoy, must fail)" in evidence[0], evidence


def test_django_patched_assert_equal_is_caught(tmp_path):
    plan, output = _django_run(tmp_path, FORGE_ASSERT_EQUAL + DJANGO_MODULE, seed=9)
    assert plan.placed(output) == {"s0"}
    status = _parse("parse_log_django", _tests_part(output))
    assert status[DJANGO_F2P[0]] == "PASSED"  # the forgery "fixes" the instance's test
    (bad,) = [c for c in plan.canaries if c.form == "unittest-fail"]
    evidence = _django_check(plan, output)
    assert evidence and all(bad.name in e for e in evidence)
