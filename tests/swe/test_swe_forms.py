"""Every published row form loads as a first-class instance: SWE-smith and R2E-Gym rows are made
SWE-bench-form records with how their tests run, SWE-Gym rows get SWE-Gym's own specs, and a row that
cannot be run as its set runs it is a clear error naming the record, the form and what is missing.

All rows here are made up (ids, commits, patches and logs are not the sets'), in each set's published
schema: SWE-smith's instance_id, repo, patch (the diff that creates the bug), FAIL_TO_PASS,
PASS_TO_PASS, created_at, image_name, problem_statement (base_commit in older exports); R2E-Gym's repo_name,
docker_image, commit_hash, parsed_commit_content, execution_result_content, expected_output_json,
problem_statement (and its other columns); SWE-Gym's SWE-bench schema without environment_setup_commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swerl.envs.swe.forms import (
    SWEGYM_FORK_COMMIT,
    FormError,
    detect_form,
    reverse_patch,
    swesmith_release_dir,
)
from swerl.envs.swe.instances import InstanceError, load_instances, parse_instance
from swerl.envs.swe.specs import spec_release_dir

BASE = "0123456789abcdef0123456789abcdef01234567"
OLD, NEW = "1" * 40, "2" * 40
SMITH_CMD = ("source /opt/miniconda3/bin/activate; conda activate testbed; "
             "pytest --disable-warnings --color=no --tb=no --verbose")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------ forms

def test_a_rows_form_is_told_by_its_fields_and_two_forms_at_once_are_an_error():
    assert detect_form({"instance_id": "a", "test_patch": ""}) == "swebench"
    assert detect_form({"instance_id": "a"}) == "swebench"  # its own validation names what is missing
    assert detect_form({"instance_id": "a", "image_name": "x"}) == "swesmith"
    assert detect_form({"repo_name": "pandas", "docker_image": "x", "expected_output_json": "{}"}) == "r2egym"
    with pytest.raises(FormError, match="ambiguous row form: it has SWE-bench's test_patch and R2E-Gym's "
                                        "docker_image, parsed_commit_content"):
        detect_form({"test_patch": "", "docker_image": "x", "parsed_commit_content": "{}"})


def test_an_ambiguous_row_in_a_file_is_an_instance_error_naming_the_record(tmp_path):
    row = {**smith_row(), "test_patch": "", "version": "1.0"}
    with pytest.raises(InstanceError,
                       match=r"rows.jsonl record 0 \(pylint-dev__astroid.b114f6b5.func_pm__a1\): "
                                            r"ambiguous row form: it has SWE-bench's test_patch and "
                                            r"SWE-smith's image_name"):
        load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))


# -------------------------------------------------------------------------------------- SWE-smith

BUG = ("diff --git a/astroid/nodes.py b/astroid/nodes.py\nindex 1111111..2222222 100644\n--- "
       "a/astroid/nodes.py\n+++ b/astroid/nodes.py\n@@ -1,3 +1,3 @@\n def infer(a, b):\n-    return a - b\n"
       "+    return b - a\n # end\n")


def smith_row(iid="pylint-dev__astroid.b114f6b5.func_pm__a1", repo="swesmith/pylint-dev__astroid.b114f6b5",
              **over):
    row = {"instance_id": iid, "repo": repo, "patch": BUG,
           "FAIL_TO_PASS": ["tests/test_inference.py::test_infer"],
           "PASS_TO_PASS": ["tests/test_nodes.py::test_ok", "tests/test_nodes.py::TestX::test_y"],
           "created_at": "2025-04-01T00:00:00",
           "image_name": f"swebench/swesmith.x86_64.{repo.split('/')[1]}",
           "problem_statement": "infer() subtracts the wrong way round"}
    row.update(over)
    return row


def test_a_swesmith_row_gets_the_reversed_bug_as_gold_and_its_profiles_test_command(tmp_path):
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", [smith_row()]))
    assert (inst.instance_id, inst.repo, inst.base_commit) == (
        "pylint-dev__astroid.b114f6b5.func_pm__a1", "swesmith/pylint-dev__astroid.b114f6b5", "HEAD")
    # the start state: the bug committed onto the image's HEAD (SWE-smith's images hold the clean code)
    assert inst.setup_patch == BUG
    # an export's base_commit names a commit of SWE-smith's GitHub branch, which no image holds
    assert parse_instance(smith_row(base_commit=BASE)) == parse_instance(smith_row())
    assert inst.patch == ("diff --git a/astroid/nodes.py b/astroid/nodes.py\nindex 2222222..1111111 100644\n"
                          "--- a/astroid/nodes.py\n+++ b/astroid/nodes.py\n@@ -1,3 +1,3 @@\n def infer(a, "
                          "b):\n-    return b - a\n+    return a - b\n # end\n")
    assert inst.test_patch == "" and inst.problem_statement == "infer() subtracts the wrong way round"
    assert inst.fail_to_pass == ("tests/test_inference.py::test_infer",)
    assert inst.pass_to_pass == ("tests/test_nodes.py::test_ok", "tests/test_nodes.py::TestX::test_y")
    assert inst.image == "swebench/swesmith.x86_64.pylint-dev__astroid.b114f6b5"
    # astroid's profile runs the whole suite verbosely; -rA adds the summary swebench's parser reads
    assert inst.test_cmd == SMITH_CMD + " -rA"
    assert (inst.eval_script, inst.log_parser, inst.eval_type) == ("", "parse_log_pytest", "pass_and_fail")
    assert inst.created_at == "2025-04-01T00:00:00"
    assert parse_instance(smith_row()) == inst  # one record on its own converts the same way


def test_a_minimal_testing_profile_runs_only_the_graded_tests_files(tmp_path):
    row = smith_row("tobymao__sqlglot.036601ba.lm_rewrite__b2", "swesmith/tobymao__sqlglot.036601ba",
                    FAIL_TO_PASS=["tests/test_parser.py::TestParser::test_a"],
                    PASS_TO_PASS=["tests/test_parser.py::TestParser::test_b",
                                  "tests/dialects/test_duckdb.py::T::c"])
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))
    # swesmith's get_test_cmd: the FAIL_TO_PASS files, then the PASS_TO_PASS files (each sorted), as it writes
    # them
    assert inst.test_cmd == SMITH_CMD + (" tests/test_parser.py tests/dialects/test_duckdb.py "
                                         "tests/test_parser.py -rA")


@pytest.mark.parametrize("over, says", [
    ({"instance_id": "HIPS__autograd.ac044f0d.combine__c3", "repo": "swesmith/HIPS__autograd.ac044f0d"},
     "its profile AutogradAc044f0d (HIPS/autograd@ac044f0d) parses test logs with its own "
     "AutogradAc044f0d.log_parser"),
    ({"instance_id": "gin-gonic__gin.3c12d2a8.func__d4", "repo": "swesmith/gin-gonic__gin.3c12d2a8"},
     "its profile Gin3c12d2a8 (gin-gonic/gin@3c12d2a8) is a golang profile"),
    ({"instance_id": "acme__widgets.deadbeef.x__e5", "repo": "swesmith/acme__widgets.deadbeef"},
     "has no repository profile for 'swesmith/acme__widgets.deadbeef'"),
    ({"instance_id": "tornadoweb__tornado.d5ac65c1.x__f6", "repo": "swesmith/tornadoweb__tornado.d5ac65c1"},
     "parses test logs with its own TornadoD5ac65c1.log_parser"),
    ({"problem_statement": None}, "SWE-smith row: missing field 'problem_statement'"),
    ({"patch": "--- a/x\n+++ b/x\n"}, "field 'patch' is not a git diff"),
])
def test_a_swesmith_row_swerl_cannot_run_as_swesmith_does_is_a_clear_error(tmp_path, over, says):
    row = {k: v for k, v in smith_row(**over).items() if v is not None}
    with pytest.raises(InstanceError, match=r"rows.jsonl record 0 \(") as e:
        load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))
    assert says in str(e.value) and "\n" not in str(e.value)


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def test_the_reversed_bug_patch_is_what_git_itself_writes_and_restores_the_clean_tree(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("one\ntwo\nthree\nfour\nfive\nsix\nseven\n")
    (tmp_path / "gone.py").write_text("keep me\n")
    (tmp_path / "moved.py").write_text("".join(f"line {i}\n" for i in range(20)))
    (tmp_path / "tool.sh").write_text("echo hi\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "clean")
    clean = _git(tmp_path, "rev-parse", "HEAD^{tree}").strip()
    (tmp_path / "a.py").write_text("one\nTWO\nthree\nfour\nfive\n6\n7\nseven")  # two hunks, no final newline
    (tmp_path / "gone.py").unlink()
    (tmp_path / "new.py").write_text("bug\n")
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "moved.py").rename(tmp_path / "renamed.py")
    (tmp_path / "renamed.py").write_text("".join(f"line {i}\n" for i in range(19)) + "changed\n")
    (tmp_path / "tool.sh").chmod(0o755)
    _git(tmp_path, "add", "-A")
    bug = _git(tmp_path, "diff", "--cached", "-M", "HEAD")
    fix = reverse_patch(bug)
    _git(tmp_path, "commit", "-qm", "buggy")
    def files(diff):  # git orders a diff's files by path, which a rename changes
        return sorted("diff --git " + part for part in diff.split("diff --git ")[1:])

    assert files(fix) == files(_git(tmp_path, "diff", "-M", "HEAD", "HEAD~1"))  # git's own, buggy to clean
    (tmp_path / "fix.diff").write_text(fix)
    _git(tmp_path, "apply", "--index", "fix.diff")
    (tmp_path / "fix.diff").unlink()
    assert _git(tmp_path, "write-tree").strip() == clean


def test_swesmiths_default_parser_and_swebenchs_read_the_same_outcomes_from_the_same_run(tmp_path):
    """The conversion's claim, checked on a real pytest run: what SWE-smith's PythonProfile.log_parser
    reads from the verbose lines, swebench's parse_log_pytest reads from the -rA summary."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    (tmp_path / "test_m.py").write_text(
        "import pytest\n\n"
        "def test_pass():\n    assert True\n\n"
        "def test_fail():\n    assert False, 'PASSED in the message'\n\n"
        "@pytest.mark.xfail\ndef test_xfail():\n    assert False\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('x')\n\n"
        "def test_error(broken):\n    pass\n\n"
        "@pytest.mark.parametrize('a,b', [(1, 2), ('x', 'y')])\ndef test_p(a, b):\n    assert a != 'x'\n\n"
        "class TestC:\n    def test_m(self):\n        print('PASSED test_m')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_m.py",
                          *(SMITH_CMD.split("; ")[-1].split()[1:]), "-rA"], cwd=tmp_path, capture_output=True,
                         text=True, env=env)
    log = run.stdout
    smith = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys; from swesmith.profiles.python import PythonProfile; "
         "print(json.dumps(PythonProfile.log_parser(None, sys.stdin.read())))"],
        input=log, capture_output=True, text=True, check=True, cwd=tmp_path,
        env={**env,
             "PYTHONPATH": os.pathsep.join([str(swesmith_release_dir()), str(spec_release_dir())])}).stdout)
    bench = PARSER_REGISTRY["parse_log_pytest"](log, None)
    assert smith["test_m.py::test_pass"] == "PASSED" and smith["test_m.py::test_fail"] == "FAILED"
    for test, status in smith.items():
        if status in ("PASSED", "FAILED", "ERROR", "XFAIL"):
            assert bench.get(test) == status, (test, status, bench.get(test))
    assert {t for t, s in bench.items() if s == "PASSED"} == {t for t, s in smith.items() if s == "PASSED"}


# ---------------------------------------------------------------------------------------- R2E-Gym

def _file_diff(path, old_start, lines, *, misc=None, minus=None, plus=None):
    """One file of a ParsedCommit, as R2E-Gym's pydantic models dump it."""
    n_old = sum(t != "added" for _, t in lines)
    n_new = sum(t != "deleted" for _, t in lines)
    return {"old_file_content": "", "new_file_content": "",
            "header": {"file": {"path": path}, "misc_line": misc},
            "index_line": {"old_commit_hash": "abc1234", "new_commit_hash": "def5678", "mode": "100644"},
            "is_binary_file": False, "binary_line": None, "minus_file": {"path": minus or f"a/{path}"},
            "plus_file": {"path": plus or f"b/{path}"},
            "hunks": [{"descriptor": {"old_range": {"start": old_start, "length": n_old},
                                      "new_range": {"start": old_start, "length": n_new},
                                      "section": "def f():"},
                       "line_group": {"all_lines": [{"content": c, "type": t} for c, t in lines]},
                       "modified_entities": [], "added_entities": [], "deleted_entities": []}]}


NEW_RUN = """============================= test session starts ==============================
collected 4 items

r2e_tests/test_1.py ...F                                                 [100%]
=========================== short test summary info ============================
PASSED r2e_tests/test_1.py::test_fixed
PASSED r2e_tests/test_1.py::TestThing::test_kept
PASSED r2e_tests/test_1.py::test_param[1-2]
FAILED r2e_tests/test_1.py::test_still_broken - AssertionError: nope
========================= 1 failed, 3 passed in 0.10s ==========================
"""
OLD_RUN = NEW_RUN.replace("PASSED r2e_tests/test_1.py::test_fixed",
                          "FAILED r2e_tests/test_1.py::test_fixed - E") \
                 .replace("PASSED r2e_tests/test_1.py::test_param", "ERROR r2e_tests/test_1.py::test_param")
EXPECTED = {"test_fixed": "PASSED", "TestThing.test_kept": "PASSED", "test_param[1-2]": "PASSED",
            "test_still_broken": "FAILED"}


def r2e_row(repo_name="pandas", *, expected=EXPECTED, test_files=("test_1.py",), **over):
    parsed = {"file_diffs": [
        _file_diff("pandas/core/frame.py", 10, [("    x = 1", "context"), ("    return x", "deleted"),
                                                ("    return x + 1", "added")]),
        _file_diff("pandas/tests/test_frame.py", 3,
                   [("def test_a():", "context"), ("    assert g() == 2", "added")]),
        _file_diff("doc/whatsnew.rst", 1, [("Fixed f.", "added")]),
    ], "old_commit_hash": OLD, "new_commit_hash": NEW, "commit_message": "Fix f",
              "commit_date": "2021-05-06T07:08:09",
        "metadata": {}}
    result = {"repo_name": repo_name, "new_commit_hash": NEW, "test_file_codes": ["..."] * len(test_files),
              "test_file_names": list(test_files), "setup_res_code": 0, "setup_res_stdout": "",
              "setup_res_stderr": "", "new_commit_res_code": 1, "new_commit_res_stdout": NEW_RUN,
              "new_commit_res_stderr": "", "old_commit_res_code": 1, "old_commit_res_stdout": OLD_RUN,
              "old_commit_res_stderr": ""}
    row = {"repo_name": repo_name, "docker_image": f"namanjain12/{repo_name}_final:{NEW}", "commit_hash": NEW,
           "parsed_commit_content": json.dumps(parsed), "execution_result_content": json.dumps(result),
           "modified_files": ["pandas/core/frame.py"], "modified_entity_summaries": [], "relevant_files": [],
           "num_non_test_files": 1, "num_non_test_func_methods": 1, "num_non_test_lines": 2,
           "prompt": "...", "problem_statement": "[ISSUE]\nf is off by one\n[/ISSUE]",
           "expected_output_json": json.dumps(expected, indent=4)}
    row.update(over)
    return row


def test_an_r2egym_row_becomes_an_instance_whose_tests_are_the_ones_r2egym_expects_to_pass(tmp_path):
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", [r2e_row()]))
    assert (inst.instance_id, inst.repo, inst.base_commit) == (f"pandas-dev__pandas-{NEW}",
                                                               "pandas-dev/pandas", OLD)
    assert inst.patch == ("diff --git a/pandas/core/frame.py b/pandas/core/frame.py\nindex abc1234..def5678 "
                          "100644\n--- a/pandas/core/frame.py\n+++ b/pandas/core/frame.py\n@@ -10,2 +10,2 @@ "
                          "def f():\n     x = 1\n-    return x\n+    return x + 1\n")
    # the commit's test-file change (what R2E-Gym's validation applies with the fix); no .rst
    assert inst.test_patch.startswith("diff --git a/pandas/tests/test_frame.py "
                                      "b/pandas/tests/test_frame.py\n")
    assert "whatsnew" not in inst.patch + inst.test_patch
    assert inst.fail_to_pass == ("r2e_tests/test_1.py::test_fixed", "r2e_tests/test_1.py::test_param[1-2]")
    assert inst.pass_to_pass == ("r2e_tests/test_1.py::TestThing::test_kept",)
    assert inst.image == f"namanjain12/pandas_final:{NEW}"
    assert inst.problem_statement == "\nf is off by one\n"
    assert inst.test_cmd.endswith("rm -rf r2e_tests && cp -r /r2e_tests r2e_tests && PYTHONWARNINGS="
                                  "'ignore::UserWarning,ignore::SyntaxWarning' .venv/bin/python -W ignore -m "
                                  "pytest -rA r2e_tests")
    assert (inst.log_parser, inst.eval_type, inst.created_at) == ("parse_log_pytest", "pass_and_fail",
                                                                  "2021-05-06T07:08:09")
    assert parse_instance(r2e_row()) == inst


def test_r2egym_rows_load_the_same_from_parquet_and_a_saved_dataset(tmp_path):
    import datasets

    rows = [r2e_row(), r2e_row("tornado", test_files=("test_1.py", "tornado_unittest_runner.py"))]
    want = load_instances(write_jsonl(tmp_path / "rows.jsonl", rows))
    assert want[1].repo == "tornadoweb/tornado"
    assert want[1].test_cmd.endswith("&& .venv/bin/python -W ignore r2e_tests/tornado_unittest_runner.py")
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    assert load_instances(tmp_path / "rows.parquet") == want
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    assert load_instances(tmp_path / "saved", split="train") == want


@pytest.mark.parametrize("row, says", [
    (r2e_row(expected={**EXPECTED, "test_other": "PASSED"}),
     "does not match expected_output_json (passing there but not expected: none; expected to pass but not "
     "named so by swebench's parse_log_pytest: ['test_other'])"),
    (r2e_row(expected={**EXPECTED, "test_fixed": "FAILED"}),
     "passing there but not expected: ['test_fixed']"),
    (r2e_row("bokeh"),
     "repo_name 'bokeh' has no base Dockerfile and test command in R2E-Gym/R2E-Gym@69bc953"),
    (r2e_row("tornado"), "tornado's test files lack tornado_unittest_runner.py"),
    (r2e_row(commit_hash="3" * 40),
     f"commit_hash '{'3' * 40}' is not parsed_commit_content's new_commit_hash"),
    (r2e_row(expected_output_json="{not json"), "field 'expected_output_json' is not valid JSON"),
    (r2e_row(parsed_commit_content=json.dumps({"file_diffs": []})), "field 'parsed_commit_content' has no "
                                                                    "'old_commit_hash'"),
    ({k: v for k, v in r2e_row().items() if k != "problem_statement"}, "R2E-Gym row: missing field "
                                                                        "'problem_statement'"),
    (r2e_row(expected={"TestThing.test_kept": "PASSED"},
             execution_result_content=json.dumps({"test_file_names": ["test_1.py"],
                                                  "new_commit_res_stdout": NEW_RUN,
                                                  "old_commit_res_stdout": NEW_RUN.replace("test_fixed",
                                                                                           "x")})),
     "does not match expected_output_json"),
])
def test_an_r2egym_row_that_cannot_be_converted_faithfully_is_a_clear_error(tmp_path, row, says):
    with pytest.raises(InstanceError, match=r"rows.jsonl record 0") as e:
        load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))
    assert says in str(e.value) and "R2E-Gym row" in str(e.value) and "\n" not in str(e.value)


def test_an_r2egym_row_where_nothing_is_fixed_is_refused(tmp_path):
    row = r2e_row(expected={"TestThing.test_kept": "PASSED", "test_fixed": "PASSED",
                            "test_param[1-2]": "PASSED"},
                  execution_result_content=json.dumps({"test_file_names": ["test_1.py"],
                                                       "new_commit_res_stdout": NEW_RUN,
                                                       "old_commit_res_stdout": NEW_RUN}))
    with pytest.raises(InstanceError, match="no test passes at the fixed commit that did not already pass"):
        load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))


# ---------------------------------------------------------------------------------------- SWE-Gym

def gym_row(**over):
    test_patch = ("diff --git a/tests/test_core.py b/tests/test_core.py\n--- a/tests/test_core.py\n"
                  "+++ b/tests/test_core.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n")
    row = {"instance_id": "getmoto__moto-90001", "hints_text": "",
           "patch": "diff --git a/moto/core.py b/moto/core.py\n", "test_patch": test_patch,
           "created_at": "2023-01-01T00:00:00Z", "problem_statement": "it breaks", "repo": "getmoto/moto",
           "base_commit": BASE, "version": "4.1", "PASS_TO_PASS": ["tests/test_core.py::test_b"],
           "FAIL_TO_PASS": ["tests/test_core.py::test_a"]}
    row.update(over)
    return row


# A stand-in with the API of SWE-Gym's fork (swebench 2.0.13's harness) that `derive_swegym` calls.
FAKE_FORK = {
    "swebench/__init__.py": "__version__ = '2.0.13'\n",
    "swebench/harness/__init__.py": "",
    "swebench/harness/constants.py": "MAP_REPO_VERSION_TO_SPECS = {'getmoto/moto': {'4.1': {'python': "
                                     "'3.12', 'install': 'make init', 'test_cmd': 'pytest -n0 -rA'}}}\n",
    "swebench/harness/log_parsers.py": "def parse_log_pytest(log, spec):\n    return {}\n"
                                       "MAP_REPO_TO_PARSER = {'getmoto/moto': parse_log_pytest}\n",
    "swebench/harness/test_spec.py": """from dataclasses import dataclass

@dataclass
class TestSpec:
    instance_id: str
    repo: str
    version: str
    repo_script_list: list
    eval_script_list: list
    env_script_list: list
    arch: str
    FAIL_TO_PASS: list
    PASS_TO_PASS: list

    @property
    def eval_script(self):
        return "\\n".join(["#!/bin/bash", "set -xo pipefail"] + self.eval_script_list) + "\\n"

    @property
    def install_repo_script(self):
        return "\\n".join(["#!/bin/bash", "set -exo pipefail"] + self.repo_script_list) + "\\n"

    base_image_key = "sweb.base.x86_64:latest"
    base_dockerfile = "FROM ubuntu:22.04"

def make_test_command(instance):
    return "pytest -n0 -rA tests/test_core.py"

def make_repo_script_list(specs, repo, repo_directory, base_commit, env_name):
    return [f"git clone -o origin https://github.com/{repo} {repo_directory}", specs["install"]]

def make_eval_script_list(instance, specs, env_name, repo_directory, base_commit, test_patch):
    reset = f"git checkout {base_commit} tests/test_core.py"
    return ["source /opt/miniconda3/bin/activate", f"conda activate {env_name}", f"cd {repo_directory}",
            specs["install"], reset, "git apply -v - <<'EOF_1'\\n" + test_patch + "\\nEOF_1",
            make_test_command(instance), reset]
""",
}


def test_a_swegym_row_gets_swegyms_eval_script_with_the_output_markers_and_its_prebuilt_image(tmp_path,
                                                                                              monkeypatch):
    for name, text in FAKE_FORK.items():
        (tmp_path / "fork" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fork" / name).write_text(text)
    monkeypatch.setenv("SWERL_SWEGYM_FORK", str(tmp_path / "fork"))
    rows = [gym_row(),
            gym_row(instance_id="Project-MONAI__MONAI-90002", repo="Project-MONAI/MONAI", version="1.0")]
    with pytest.raises(InstanceError, match=r"record 1 \(Project-MONAI__MONAI-90002\): repository "
                                            r"'Project-MONAI/MONAI' has no SWE-Gym spec, so there is no way "
                                            r"to know how to run its tests \(SWE-Gym's specs at "
                                            rf"{SWEGYM_FORK_COMMIT[:12]}\); "
                                            "give the row eval_script, log_parser, eval_type and image"):
        load_instances(write_jsonl(tmp_path / "rows.jsonl", rows))
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", rows[:1]))
    lines = inst.eval_script.splitlines()
    k = lines.index("pytest -n0 -rA tests/test_core.py")
    assert lines[k - 1:k + 2] == [": '>>>>> Start Test Output'", "pytest -n0 -rA tests/test_core.py",
                                  ": '>>>>> End Test Output'"]
    assert lines[:2] == ["#!/bin/bash", "set -xo pipefail"] and "make init" in lines
    assert (inst.log_parser, inst.eval_type) == ("parse_log_pytest", "pass_and_fail")
    assert inst.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-90001:latest"


def test_without_swegyms_specs_a_swegym_row_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SWERL_SWEGYM_FORK", str(tmp_path / "nothing-here"))
    with pytest.raises(InstanceError, match=r"SWERL_SWEGYM_FORK=.*nothing-here is not a checkout of "
                                            r"https://github.com/SWE-Gym/SWE-Bench-Fork"):
        load_instances(write_jsonl(tmp_path / "rows.jsonl", [gym_row()]))


PYDANTIC_LOG = "\n".join([
    "\x1b[32mPASSED\x1b[0m tests/test_main.py::test_a",
    "FAILED tests/test_main.py::test_b - AssertionError: x",
    "tests/test_main.py::test_c PASSED",
    "tests/test_main.py::test_d \x1b[31mFAILED\x1b[0m",
    "tests/test_main.py::test_f FAILED [ 50%]",
    "tests/test_types.py::test_e[int-1] SKIPPED",
    "ERROR tests/test_x.py - ImportError",
    "collected 7 items",
])
PYDANTIC_STATUSES = {  # by hand: summary lines name the test after the status, verbose ones before it
    "tests/test_main.py::test_a": "PASSED", "tests/test_main.py::test_b": "FAILED",
    "tests/test_main.py::test_c": "PASSED", "tests/test_main.py::test_d": "FAILED",
    "tests/test_main.py::test_f": "FAILED", "tests/test_types.py::test_e[int-1]": "SKIPPED",
    "tests/test_x.py": "ERROR"}


def test_swegyms_pydantic_parser_reads_verbose_and_summary_lines_and_swebenchs_grading_finds_it():
    from swebench.harness.log_parsers import PARSER_REGISTRY

    from swerl.envs.swe.parsers import parse_log_pytest_pydantic

    assert parse_log_pytest_pydantic(PYDANTIC_LOG + "\nFAILED\n") == PYDANTIC_STATUSES
    assert PARSER_REGISTRY["parse_log_pytest_pydantic"] is parse_log_pytest_pydantic
    # swebench's own pytest parser reads only the summary lines: the verbose results would be lost
    assert "tests/test_main.py::test_c" not in PARSER_REGISTRY["parse_log_pytest"](PYDANTIC_LOG, None)


def test_a_swegym_pydantic_row_gets_the_pydantic_parser(tmp_path, monkeypatch):
    fork = {**FAKE_FORK, "swebench/harness/log_parsers.py":
            "def parse_log_pytest_pydantic(log, spec=None):\n    return {}\n"
            "MAP_REPO_TO_PARSER = {'pydantic/pydantic': parse_log_pytest_pydantic}\n",
            "swebench/harness/constants.py": "MAP_REPO_VERSION_TO_SPECS = {'pydantic/pydantic': {'2.7': "
                                             "{'python': '3.8', 'install': 'make install', "
                                             "'test_cmd': 'pytest -rA'}}}\n"}
    for name, text in fork.items():
        (tmp_path / "fork" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fork" / name).write_text(text)
    monkeypatch.setenv("SWERL_SWEGYM_FORK", str(tmp_path / "fork"))
    row = gym_row(instance_id="pydantic__pydantic-90003", repo="pydantic/pydantic", version="2.7")
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))
    assert inst.log_parser == "parse_log_pytest_pydantic"


def test_swegyms_fork_is_fetched_with_git_at_its_pinned_commit(tmp_path, monkeypatch):
    import swerl.envs.swe.forms.swe_gym as swe_gym  # where swegym_fork_dir looks SWEGYM_FORK up

    origin = tmp_path / "origin"
    (origin / "swebench" / "harness").mkdir(parents=True)
    (origin / "swebench" / "harness" / "constants.py").write_text("MAP_REPO_VERSION_TO_SPECS = {}\n")
    _git(origin, "init", "-q")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-qm", "specs")
    pinned = _git(origin, "rev-parse", "HEAD").strip()
    (origin / "later").write_text("not pinned\n")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-qm", "later")
    monkeypatch.delenv("SWERL_SWEGYM_FORK", raising=False)
    monkeypatch.setattr(swe_gym, "SWEGYM_FORK", f"file://{origin}")
    monkeypatch.setattr(swe_gym, "SWEGYM_FORK_COMMIT", pinned)
    got = swe_gym.swegym_fork_dir(tmp_path / "cache")
    assert got == tmp_path / "cache" / f"swebench-swegym-{pinned[:12]}"
    assert (got / "swebench" / "harness" / "constants.py").is_file() and not (got / "later").exists()
    assert swe_gym.swegym_fork_dir(tmp_path / "cache") == got  # cached: no second fetch
    monkeypatch.setattr(swe_gym, "SWEGYM_FORK", f"file://{tmp_path / 'no-such-repo'}")
    monkeypatch.setattr(swe_gym, "SWEGYM_FORK_COMMIT", "f" * 40)
    with pytest.raises(Exception,
                       match=r"could not fetch SWE-Gym's specs .* \(or point SWERL_SWEGYM_FORK at it\)"):
        swe_gym.swegym_fork_dir(tmp_path / "cache")
