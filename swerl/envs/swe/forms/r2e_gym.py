"""R2E-Gym's rows (`docker_image`, `parsed_commit_content`, `execution_result_content`,
`expected_output_json`) made SWE-bench-form records (`r2egym_record`): the patches from the parsed
commit, the tests R2E-Gym runs, FAIL_TO_PASS / PASS_TO_PASS from the recorded runs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from swerl.envs.swe.forms.common import FormError

R2E_REVISION = "R2E-Gym/R2E-Gym@69bc953"
R2E_REPOS = {
    "aiohttp": "aio-libs/aiohttp", "coveragepy": "nedbat/coveragepy", "datalad": "datalad/datalad",
    "numpy": "numpy/numpy", "orange3": "biolab/orange3", "pandas": "pandas-dev/pandas",
    "pillow": "python-pillow/Pillow", "pyramid": "Pylons/pyramid", "scrapy": "scrapy/scrapy",
    "sympy": "sympy/sympy", "tornado": "tornadoweb/tornado",
}
"""R2E-Gym's `repo_name` → the GitHub repository its image clones (the `git clone` line of each
src/r2egym/repo_analysis/base_dockerfiles/Dockerfile.<repo_name>)."""

_R2E_PYTEST = ("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' .venv/bin/python -W ignore -m "
               "pytest -rA r2e_tests")
R2E_TESTS_CMD = {name: _R2E_PYTEST for name in R2E_REPOS}
R2E_TESTS_CMD["orange3"] = ("QT_QPA_PLATFORM=minimal "
                            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' xvfb-run "
                            "--auto-servernum .venv/bin/python -W ignore -m pytest -rA r2e_tests")
"""The command R2E-Gym writes to run_tests.sh (src/r2egym/repo_analysis/repo_analysis_args.py,
`tests_cmd`; repo_testextract.py writes it out), run in /testbed."""
R2E_RUNNERS = {
    "tornado": ("tornado_unittest_runner.py",
                ".venv/bin/python -W ignore r2e_tests/tornado_unittest_runner.py"),
    "pillow": ("unittest_custom_runner.py", ".venv/bin/python -W ignore r2e_tests/unittest_custom_runner.py"),
}
"""repo_testextract.py's exceptions: tornado's tests (and pillow's unittest-style ones, whose test files
then include the runner) run with R2E-Gym's pytest-like unittest runner, shipped among the test files."""

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")


def _json_field(rec: dict, field: str, where: str) -> Any:
    value = rec.get(field)
    if value is None:
        raise FormError(f"{where}: R2E-Gym row: missing field {field!r}")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise FormError(f"{where}: R2E-Gym row: field {field!r} is not valid JSON ({e})") from None
    return value


def _get(obj: Any, path: str, field: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    cur = obj
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise FormError(f"{where}: R2E-Gym row: field {field!r} has no {path!r}")
        cur = cur[key]
    if not isinstance(cur, kind):
        raise FormError(f"{where}: R2E-Gym row: {field}.{path} must be {getattr(kind, '__name__', kind)}, "
                        f"got {type(cur).__name__}")
    return cur


def _r2e_is_test_file(path: str) -> bool:
    """R2E-Gym's `FileDiff.is_test_file` (src/r2egym/commit_models/diff_classes.py)."""
    parts = path.split("/")
    return (path.endswith("_test.py") or path.startswith("test_") or parts[-1].startswith("test_")
            or any(p in parts for p in ("tests", "Tests", "test", "Test")))


def _r2e_range(r: dict, where: str) -> str:
    start = _get(r, "start", "parsed_commit_content", where, int)
    length = r.get("length")
    return f"{start}" if length is None else f"{start},{length}"


_R2E_LINE = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def _r2e_file_patch(fd: dict, where: str) -> str:
    """R2E-Gym's `FileDiff.get_patch`: the file's diff as git wrote it (R2E-Gym checks the round trip
    when it stores a commit: src/r2egym/repo_analysis/store_repo_commits.py)."""
    f = "parsed_commit_content"
    path = _get(fd, "header.file.path", f, where)
    patch = f"diff --git a/{path} b/{path}\n"
    misc = fd["header"].get("misc_line")
    if misc:
        patch += misc + "\n"
    index = fd.get("index_line")
    if index:
        mode = index.get("mode") or ""
        patch += (f"index {_get(index, 'old_commit_hash', f, where)}.."
                  f"{_get(index, 'new_commit_hash', f, where)}{' ' if mode else ''}{mode}\n")
    if fd.get("is_binary_file"):
        patch += _get(fd, "binary_line", f, where) + "\n"
    if fd.get("minus_file") and fd.get("plus_file"):
        patch += f"--- {_get(fd, 'minus_file.path', f, where)}\n+++ {_get(fd, 'plus_file.path', f, where)}\n"
    for hunk in fd.get("hunks") or []:
        d = _get(hunk, "descriptor", f, where, dict)
        section = d.get("section") or ""
        patch += (f"@@ -{_r2e_range(_get(d, 'old_range', f, where, dict), where)} "
                  f"+{_r2e_range(_get(d, 'new_range', f, where, dict), where)} "
                  f"@@{' ' + section if section else ''}\n")
        for line in _get(hunk, "line_group.all_lines", f, where, list):
            kind = line.get("type") if isinstance(line, dict) else None
            if kind not in _R2E_LINE or not isinstance(line.get("content"), str):
                raise FormError(f"{where}: R2E-Gym row: {f} has a hunk line that is not "
                                "{content, type: context|added|deleted|note}")
            patch += f"{_R2E_LINE[kind]}{line['content']}\n"
    return patch


def r2e_patches(parsed: dict, where: str) -> tuple[str, str]:
    """(fix, tests): the commit's non-test and test Python file diffs, as R2E-Gym's
    `ParsedCommit.get_patch(test_file=False)` / `get_patch(non_test_file=False)` make them (Python files
    only, its default)."""
    diffs = _get(parsed, "file_diffs", "parsed_commit_content", where, list)
    fix = tests = ""
    for fd in diffs:
        if not isinstance(fd, dict):
            raise FormError(f"{where}: R2E-Gym row: parsed_commit_content.file_diffs holds a "
                            f"{type(fd).__name__}")
        path = _get(fd, "header.file.path", "parsed_commit_content", where)
        if not path.endswith(".py"):
            continue
        if _r2e_is_test_file(path):
            tests += _r2e_file_patch(fd, where)
        else:
            fix += _r2e_file_patch(fd, where)
    return fix, tests


def _r2e_key(test_id: str) -> str:
    """How R2E-Gym's parse_log_pytest names a test (src/r2egym/repo_analysis/execution_log_parser.py):
    the node id without its file, `::` as `.`, the ' - message' cut (docker.py `_calculate_reward_r2e`)."""
    return ".".join(test_id.split("::")[1:]).split(" - ")[0]


def _r2e_statement(text: str) -> str:
    """What R2E-Gym shows the agent: the text between [ISSUE] and [/ISSUE] when there is one
    (agenthub/runtime/docker.py `get_task_instruction`)."""
    m = re.search(r"\[ISSUE\](.*)\[/ISSUE\]", text, re.DOTALL)
    return m.group(1) if m else text


def r2egym_record(rec: dict, *, where: str) -> dict:
    """The SWE-bench-form record of an R2E-Gym row (see the module docstring for the conversion)."""
    from swebench.harness.constants import TestStatus
    from swebench.harness.log_parsers import PARSER_REGISTRY

    for field in ("repo_name", "docker_image", "problem_statement"):
        if rec.get(field) is None:
            raise FormError(f"{where}: R2E-Gym row: missing field {field!r}")
        if not isinstance(rec[field], str):
            raise FormError(f"{where}: R2E-Gym row: field {field!r} must be a string, got "
                            f"{type(rec[field]).__name__}")
    name = rec["repo_name"]
    if name not in R2E_REPOS:
        raise FormError(f"{where}: R2E-Gym row: repo_name {name!r} has no base Dockerfile and test command "
                        f"in {R2E_REVISION} (it has them for {', '.join(sorted(R2E_REPOS))}), so there is no "
                        "way to know its repository or how its tests run")
    parsed = _json_field(rec, "parsed_commit_content", where)
    result = _json_field(rec, "execution_result_content", where)
    expected = _json_field(rec, "expected_output_json", where)
    if not isinstance(parsed, dict) or not isinstance(result, dict) or not isinstance(expected, dict):
        raise FormError(f"{where}: R2E-Gym row: parsed_commit_content, execution_result_content and "
                        "expected_output_json must each hold a JSON object")
    old, new = (_get(parsed, k, "parsed_commit_content", where)
                for k in ("old_commit_hash", "new_commit_hash"))
    for label, sha in (("old_commit_hash", old), ("new_commit_hash", new)):
        if not _HEX40.match(sha):
            raise FormError(f"{where}: R2E-Gym row: parsed_commit_content.{label} {sha!r} is not a 40-hex "
                            "commit")
    for field, value in (("commit_hash", rec.get("commit_hash")),
                         ("execution_result_content.new_commit_hash", result.get("new_commit_hash"))):
        if value is not None and value != new:
            raise FormError(f"{where}: R2E-Gym row: {field} {value!r} is not parsed_commit_content's "
                            f"new_commit_hash {new!r}")
    owner_repo = R2E_REPOS[name]
    iid = rec.get("instance_id")
    if iid is not None and not isinstance(iid, str):
        raise FormError(f"{where}: R2E-Gym row: field 'instance_id' must be a string")
    if not iid:
        iid = f"{owner_repo.replace('/', '__')}-{new}"
        where = f"{where} ({iid})"
    fix, tests = r2e_patches(parsed, where)
    if not fix:
        raise FormError(f"{where}: R2E-Gym row: parsed_commit_content changes no non-test Python file, so it "
                        "holds no fix")
    names = _get(result, "test_file_names", "execution_result_content", where, list)
    test_cmd = R2E_TESTS_CMD[name]
    runner = R2E_RUNNERS.get(name)
    if runner and runner[0] in names:
        test_cmd = runner[1]
    elif name == "tornado":
        raise FormError(f"{where}: R2E-Gym row: tornado's test files lack {R2E_RUNNERS['tornado'][0]}, the "
                        "runner R2E-Gym runs them with")
    parse = PARSER_REGISTRY["parse_log_pytest"]
    runs = {}
    for label in ("new_commit_res_stdout", "old_commit_res_stdout"):
        out = result.get(label)
        if not isinstance(out, str):
            raise FormError(f"{where}: R2E-Gym row: execution_result_content has no {label} (the recorded "
                            "test run FAIL_TO_PASS / PASS_TO_PASS are derived from)")
        runs[label] = parse(_ANSI.sub("", out), None)
    new_run, old_run = runs["new_commit_res_stdout"], runs["old_commit_res_stdout"]
    must_pass = [t for t, s in new_run.items() if s == TestStatus.PASSED.value]
    want = {_ANSI.sub("", k).split(" - ")[0] for k, v in expected.items() if v == "PASSED"}
    got = {_r2e_key(t) for t in must_pass}
    if got != want:
        extra, missing = sorted(got - want)[:3], sorted(want - got)[:3]
        raise FormError(f"{where}: R2E-Gym row: the run recorded at the fixed commit does not match "
                        f"expected_output_json (passing there but not expected: {extra or 'none'}; expected "
                        f"to pass but not named so by swebench's parse_log_pytest: {missing or 'none'})")
    f2p = [t for t in must_pass if old_run.get(t) != TestStatus.PASSED.value]
    p2p = [t for t in must_pass if old_run.get(t) == TestStatus.PASSED.value]
    if not f2p:
        raise FormError(f"{where}: R2E-Gym row: no test passes at the fixed commit that did not already pass "
                        "at the buggy one")
    # R2E-Gym runs the image's /r2e_tests (its hidden tests, copied in by its Dockerfiles) from /testbed
    fetch = ('test -d /r2e_tests || { echo "swerl: the image has no /r2e_tests (R2E-Gym\'s tests)"; exit 3; '
             '}; '
             "rm -rf r2e_tests && cp -r /r2e_tests r2e_tests && ")
    out = {"instance_id": iid, "repo": owner_repo, "base_commit": old, "patch": fix, "test_patch": tests,
           "problem_statement": _r2e_statement(rec["problem_statement"]), "FAIL_TO_PASS": f2p,
           "PASS_TO_PASS": p2p, "image": rec["docker_image"], "test_cmd": fetch + test_cmd,
           "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    date = parsed.get("commit_date")
    if isinstance(date, str):
        out["created_at"] = date
    if isinstance(rec.get("split"), str):
        out["split"] = rec["split"]
    return out
