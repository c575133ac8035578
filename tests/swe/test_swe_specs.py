"""SWE-bench rows as published: what they lack comes from SWE-bench's own specs, and the agent's
shell works in the environment the tests run in.

The rows here are made up (ids, commits and patches are not SWE-bench's), in the published schema:
instance_id, repo, base_commit, patch, test_patch, problem_statement, hints_text, created_at,
version, FAIL_TO_PASS, PASS_TO_PASS, environment_setup_commit — and nothing on how to run the tests.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from swe_fixtures import pick, swe_suite, swebench_layout_instance  # noqa: F401

from swerl.envs.swe.instances import InstanceError, load_instances

BASE = "0123456789abcdef0123456789abcdef01234567"


def published(iid: str, repo: str, version: str, test_file: str, **over) -> dict:
    test_patch = (f"diff --git a/{test_file} b/{test_file}\n--- a/{test_file}\n+++ b/{test_file}\n"
                  "@@ -1 +1,2 @@\n x = 1\n+y = 2\n")
    row = {"instance_id": iid, "repo": repo, "base_commit": BASE, "patch": "diff --git a/a.py b/a.py\n",
           "test_patch": test_patch, "problem_statement": "it breaks", "hints_text": "",
           "created_at": "2020-01-01T00:00:00Z", "version": version, "FAIL_TO_PASS": '["test_a"]',
           "PASS_TO_PASS": "[]", "environment_setup_commit": "f" * 40}
    row.update(over)
    return row


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_published_django_row_gets_swebenchs_eval_script_parser_and_image(tmp_path):
    rows = [published("django__django-90001", "django/django", "3.0", "tests/auth_tests/test_validators.py")]
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", rows))
    lines = inst.eval_script.splitlines()
    # SWE-bench's django recipe, written out by hand: activate the testbed env, reset the test file,
    # apply the test patch, run the module with django's runner between the output markers, reset again
    assert lines[:5] == ["#!/bin/bash", "set -uxo pipefail", "source /opt/miniconda3/bin/activate",
                         "conda activate testbed", "cd /testbed"]
    reset = f"git checkout {BASE} tests/auth_tests/test_validators.py"
    start, end = lines.index(": '>>>>> Start Test Output'"), lines.index(": '>>>>> End Test Output'")
    assert lines[start + 1] == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 " \
                               "auth_tests.test_validators"
    assert end == start + 2 and lines[-1] == reset and lines.count(reset) == 2
    assert any(ln.startswith("git apply -v - <<'EOF_") for ln in lines[:start])
    assert (inst.log_parser, inst.eval_type) == ("parse_log_django", "pass_and_fail")
    assert inst.image == "sweb.eval.x86_64.django__django-90001:latest"


def test_what_a_row_has_is_kept_and_only_the_rest_is_derived(tmp_path):
    own = "#!/bin/bash\necho mine\n"
    rows = [published("sympy__sympy-90002", "sympy/sympy", "1.5", "sympy/core/tests/test_basic.py",
                      eval_script=own, image="my-registry/sympy:1")]
    (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", rows))
    # without a log_parser the row gets sympy's, never pytest's by default
    assert (inst.eval_script, inst.image, inst.log_parser) == (own, "my-registry/sympy:1", "parse_log_sympy")


@pytest.mark.parametrize("repo, version, says", [
    ("acme/widgets", "1.0", "repository 'acme/widgets' has no SWE-bench spec"),
    ("django/django", "9.9", "no SWE-bench spec for version '9.9' (specs exist for 1.10, 1.11,"),
])
def test_a_repo_or_version_without_a_spec_is_a_clear_error_naming_it(tmp_path, repo, version, says):
    rows = [published("x__y-1", repo, version, "tests/test_x.py")]
    with pytest.raises(InstanceError, match="record 0 \\(x__y-1\\)") as e:
        load_instances(write_jsonl(tmp_path / "rows.jsonl", rows))
    assert says in str(e.value) and "eval_script, log_parser, eval_type and image" in str(e.value)


def test_parquet_and_saved_datasets_load_like_jsonl_and_a_missing_split_lists_the_present_ones(tmp_path):
    import datasets

    rows = [published("django__django-90003", "django/django", "3.0", "tests/auth_tests/test_validators.py"),
            published("sympy__sympy-90004", "sympy/sympy", "1.5", "sympy/core/tests/test_basic.py")]
    want = load_instances(write_jsonl(tmp_path / "rows.jsonl", rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    assert load_instances(tmp_path / "rows.parquet") == want
    datasets.DatasetDict({"test": ds, "dev": ds.select([1])}).save_to_disk(str(tmp_path / "saved"))
    assert load_instances(tmp_path / "saved", split="test") == want
    assert [i.instance_id for i in load_instances(tmp_path / "saved", split="dev")] == ["sympy__sympy-90004"]
    with pytest.raises(InstanceError, match="no split 'train' — the splits present are dev, test"):
        load_instances(tmp_path / "saved", split="train")
    with pytest.raises(InstanceError, match="no split 'test' — the splits present are none"):
        load_instances(tmp_path / "rows.jsonl", split="test")


def test_the_agent_works_in_the_testbed_environment_and_is_told_head(docker_client, swe_suite):  # noqa: F811
    from swerl.envs.swe.env import SWEEnv, TestbedError
    from swerl.envs.swe.grading import eval_script
    from swerl.sandbox import DockerSandbox, SandboxSpec

    inst = swebench_layout_instance(docker_client, pick(swe_suite, "inflection"))
    assert "source /opt/miniconda3/envs/testbed/bin/activate" in inst.eval_script
    with DockerSandbox(SandboxSpec(image=inst.image), client=docker_client) as sb:
        start = SWEEnv(sb, inst).reset()
        task = start.messages[-1].content
        assert f"HEAD is commit {sb.base_commit[:12]}" in task
        r = sb.run('python -c "import sys; print(sys.prefix)"; echo "$VIRTUAL_ENV"; pwd')
        assert r.output == "/opt/miniconda3/envs/testbed\n/opt/miniconda3/envs/testbed\n/testbed\n"
    # a row that brings only a test command gets the same environment, for the agent and for its tests
    own = dataclasses.replace(inst, eval_script="", test_cmd="python -c 'import sys; print(sys.prefix)'")
    with DockerSandbox(SandboxSpec(image=inst.image), client=docker_client) as sb:
        SWEEnv(sb, own).reset()
        assert sb.run("echo $VIRTUAL_ENV").output == "/opt/miniconda3/envs/testbed\n"
        sb.write_file("/tmp/eval.sh", eval_script(own))
        assert "\n/opt/miniconda3/envs/testbed\n" in sb.run("bash /tmp/eval.sh 2>&1").output
    broken = dataclasses.replace(inst, eval_script=inst.eval_script.replace("envs/testbed", "envs/gone"))
    with DockerSandbox(SandboxSpec(image=inst.image), client=docker_client) as sb:
        with pytest.raises(TestbedError, match="did not activate") as e:
            SWEEnv(sb, broken).reset()
        assert e.value.failure_kind == "environment"


def test_the_instances_tests_run_in_the_agents_own_sandbox(docker_client, swe_suite):  # noqa: F811
    from swerl.envs.swe.env import check_agent_environment

    shipped = pick(swe_suite, "six")
    layout = swebench_layout_instance(docker_client, pick(swe_suite, "inflection"))
    for inst in (shipped, layout):
        check = check_agent_environment(inst, client=docker_client)
        assert check.ok, check.detail
        n, m = len(inst.fail_to_pass), len(inst.pass_to_pass)
        assert check.detail == (f"tests run in the agent's sandbox: {n}/{n} FAIL_TO_PASS fail, {m}/{m} "
                                "PASS_TO_PASS pass")
    # the fix already in place: its FAIL_TO_PASS tests pass, which the check names
    fixed = dataclasses.replace(layout, test_patch=layout.patch + layout.test_patch)
    check = check_agent_environment(fixed, client=docker_client)
    assert not check.ok and set(check.fail_to_pass_passing) == set(layout.fail_to_pass)
    # the tests' own environment missing from the agent's shell
    gone = dataclasses.replace(layout, eval_script=layout.eval_script.replace("envs/testbed", "envs/gone"))
    check = check_agent_environment(gone, client=docker_client)
    assert not check.ok and "did not activate" in check.detail


def test_a_published_row_is_graded_on_an_image_in_swebench_layout_by_swebench_name(docker_client, swe_suite,  # noqa: F811
                                                                                     tmp_path):
    """End to end: the row says only what SWE-bench publishes (its repository is one SWE-bench has a
    spec for: psf/requests 3.0 runs `pytest -rA` in the conda testbed env); the image is in SWE-bench's
    layout (venv at the conda path, swerl's `conda activate`) under SWE-bench's own image name."""
    from swerl.envs.swe.grading import grade_patch

    layout = swebench_layout_instance(docker_client, pick(swe_suite, "inflection"))
    iid = "psf__requests-90005"
    docker_client.images.get(layout.image).tag(f"sweb.eval.x86_64.{iid}", "latest")
    try:
        row = published(iid, "psf/requests", "3.0", "x", base_commit=layout.base_commit, patch=layout.patch,
                        test_patch=layout.test_patch, FAIL_TO_PASS=list(layout.fail_to_pass),
                        PASS_TO_PASS=list(layout.pass_to_pass))
        (inst,) = load_instances(write_jsonl(tmp_path / "rows.jsonl", [row]))
        assert (inst.image, inst.log_parser) == (f"sweb.eval.x86_64.{iid}:latest", "parse_log_pytest_options")
        assert "conda activate testbed" in inst.eval_script and "pytest -rA" in inst.eval_script
        gold, empty = grade_patch(inst, inst.patch), grade_patch(inst, "")
        assert gold.resolved and not gold.error, gold.error
        assert not empty.resolved and not empty.failure
    finally:
        docker_client.images.remove(f"sweb.eval.x86_64.{iid}:latest", noprune=True)
