"""Failures that say why: each test that kept a patch unresolved, with its parsed status and its log line
(`grading.name_failures`), and report.json's reasons read from the parsed results (`report_dict`). The logs
are written here by hand in pytest's `-rA` form."""

from __future__ import annotations

from swerl.envs.swe.grading import name_failures
from swerl.envs.swe.types import GradeResult, SWEInstance
from swerl.eval.report import report_dict
from swerl.eval.types import EvalSummary

LOG = """\
============================= test session starts ==============================
collected 0 items / 1 skipped
testing/test_a.py::test_fixed FAILED                                    [ 33%]
testing/test_a.py::test_kept PASSED                                     [ 66%]
=========================== short test summary info ============================
PASSED testing/test_a.py::test_kept
FAILED testing/test_a.py::test_fixed - AssertionError: assert 1 == 2
SKIPPED testing/test_b.py::test_loader - could not import 'pkg_resources'
ERROR testing/test_c.py::test_broken - ImportError
"""


def instance() -> SWEInstance:
    return SWEInstance(instance_id="o__r-1", repo="o/r", base_commit="0" * 40, problem_statement="p",
                       patch="", test_patch="",
                       fail_to_pass=("testing/test_a.py::test_fixed", "testing/test_a.py::test_new"),
                       pass_to_pass=("testing/test_a.py::test_kept", "testing/test_b.py::test_loader",
                                     "testing/test_c.py::test_broken"))


def test_each_failing_test_is_named_with_its_status_and_log_line():
    status = {"testing/test_a.py::test_fixed": "FAILED", "testing/test_a.py::test_kept": "PASSED",
              "testing/test_b.py::test_loader": "SKIPPED", "testing/test_c.py::test_broken": "ERROR"}
    got = name_failures(instance(), status, ["testing/test_a.py::test_fixed", "testing/test_a.py::test_new"],
                        ["testing/test_c.py::test_broken"], LOG)
    assert got == (
        "FAIL_TO_PASS testing/test_a.py::test_fixed: FAILED | FAILED testing/test_a.py::test_fixed - "
        "AssertionError: assert 1 == 2",
        "FAIL_TO_PASS testing/test_a.py::test_new: not run",
        "PASS_TO_PASS testing/test_c.py::test_broken: ERROR | ERROR testing/test_c.py::test_broken - "
        "ImportError",
        "PASS_TO_PASS testing/test_b.py::test_loader: SKIPPED | SKIPPED testing/test_b.py::test_loader - "
        "could not import 'pkg_resources'",
    )


def test_report_reasons_come_from_the_parsed_results(tmp_path):
    """A log that prints "collected 0 items" (pytest's own tests do) but whose results were parsed is
    unresolved for its failing tests, not `no_tests_collected`; that reason is left for a log with nothing
    parsed. A patch that did not apply (no log) has no reason."""
    log = tmp_path / "a.txt"
    log.write_text(LOG)
    empty_log = tmp_path / "b.txt"
    empty_log.write_text("collected 0 items\n")
    failing = ("FAIL_TO_PASS t1: FAILED | FAILED t1",)
    results = {
        "a": GradeResult("a", resolved=False, reward=0.0, status="RESOLVED_NO", log_path=str(log),
                         test_status=(("t1", "FAILED"),), fail_to_pass_failure=("t1",), failed_tests=failing),
        "b": GradeResult("b", resolved=False, reward=0.0, status="RESOLVED_NO", log_path=str(empty_log)),
        "c": GradeResult("c", resolved=False, reward=0.0, status="", error="the patch did not apply"),
        "d": GradeResult("d", resolved=False, reward=0.0, status="RESOLVED_NO", log_path=str(log),
                         test_status=(("t2", "ERROR"),), pass_to_pass_failure=("t2",)),
    }
    summary = EvalSummary(total_instances=4, submitted_ids=("a", "b", "c", "d"), resolved_ids=(),
                          unresolved_ids=("a", "b", "d"), empty_patch_ids=(), error_ids=("c",), failed_ids=(),
                          incomplete_ids=(), out_dir=str(tmp_path))
    report = report_dict(summary, results)
    assert report["failure_reasons"] == {"a": "fail_to_pass_failed", "b": "no_tests_collected",
                                         "d": "pass_to_pass_failed"}
    assert report["failed_tests"] == {"a": list(failing), "d": []}
    assert report["ambiguous_failure_ids"] == ["b"] and report["infra_failure_ids"] == []
