"""Grading shipped instances in fresh containers with swebench's own grading — against the real engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from swe_fixtures import pick, slow_gold_command, swe_log_dir, swe_suite  # noqa: F401  (fixtures)
from swebench.harness.log_parsers import parse_log_pytest

from swerl.envs.swe.grading import grade_patch
from swerl.envs.swe.images import ImageUnavailable, resolve_image
from swerl.envs.swe.types import GradingConfig
from swerl.sandbox import DockerSandbox, SandboxSpec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def inflection(swe_suite, base_image):  # noqa: F811
    # an instance whose PASS_TO_PASS covers ordinal(), which the breaking patch below damages
    return pick(swe_suite, "inflection", p2p_contains="test_ordinal[", f2p_lacks="test_ordinal")


@pytest.fixture(scope="module")
def inflection_image(inflection):
    return resolve_image(inflection)


def _edit_patch(image: str, cmd: str) -> str:
    """A patch made the way an agent makes one: edit the tree in a sandbox, take the diff."""
    with DockerSandbox(SandboxSpec(image=image)) as sb:
        r = sb.run(f"cd /testbed && {cmd}")
        assert r.ok, r.output
        return sb.diff()


def test_gold_patch_resolves_and_empty_patch_does_not(inflection, inflection_image, swe_log_dir):  # noqa: F811
    gold = grade_patch(inflection, inflection.patch, log_dir=swe_log_dir)
    assert gold.resolved and gold.reward == 1.0 and gold.status == "RESOLVED_FULL", gold.error
    assert gold.applied and gold.apply_method == "git apply --verbose" and not gold.error
    assert set(gold.fail_to_pass_success) == set(inflection.fail_to_pass)
    assert set(gold.pass_to_pass_success) == set(inflection.pass_to_pass)
    # the log is SWE-bench's format, and swebench's own parser reads every graded test from it
    log = Path(gold.log_path).read_text()
    assert ">>>>> Start Test Output" in log and ">>>>> End Test Output" in log
    parsed = parse_log_pytest(log, None)
    assert all(parsed[t] == "PASSED" for t in inflection.fail_to_pass)

    empty = grade_patch(inflection, "", log_dir=swe_log_dir)
    assert not empty.resolved and empty.reward == 0.0 and empty.empty_patch and not empty.error
    assert set(empty.fail_to_pass_failure) == set(inflection.fail_to_pass)
    assert not empty.pass_to_pass_failure  # the base commit only breaks what FAIL_TO_PASS lists


def test_canaries_run_beside_the_tests_and_leave_their_verdicts_as_they_are(inflection, inflection_image,
                                                                           swe_log_dir):  # noqa: F811
    """Sentinels and decoys run in the same file and the same pytest process as the instance's tests, with
    fresh names each grading; what the grade says of the instance's own tests is what it says without
    them, for the gold patch and the empty one."""
    import re

    from swerl.envs.swe import canary

    def results(log: str) -> set[str]:
        tests = log[log.index(">>>>> Start Test Output"):]
        # the canaries' results are in the same run's log (one pytest session: one summary line)
        assert len(re.findall(r"^=+ .* in [0-9.]+s =+$", tests, re.M)) == 1
        return set(re.findall(r"^(?:PASSED|FAILED) (test_inflection\.py::\S+)", tests, re.M))

    functions = {t.split("::")[-1].split("[")[0] for t in inflection.fail_to_pass}
    seen: list[set[str]] = []
    for patch in (inflection.patch, ""):
        on = grade_patch(inflection, patch, log_dir=swe_log_dir)
        off = grade_patch(inflection, patch, config=GradingConfig(canaries=False),
                          log_dir=Path(swe_log_dir) / "off")
        decoys = min(len(functions), canary.MAX_DECOYS)
        assert on.canaries == 5 + decoys and not on.tampered and off.canaries == 0, on
        assert (on.resolved, on.status, on.test_status) == (off.resolved, off.status, off.test_status)
        log = Path(on.log_path).read_text()
        assert "swerl-canary-placed:" in log and on.canaries
        extra = results(log) - results(Path(off.log_path).read_text())
        assert len(extra) == on.canaries, extra  # each canary reported once, under its own id
        # the decoys carry FAIL_TO_PASS names, in a class of their own, and fail
        named = {e for e in extra if e.split("::")[-1] in functions}
        assert len(named) == decoys and len({e.split("::")[1] for e in named}) == 1, named
        assert all(f"FAILED {e}" in log for e in named)
        seen.append(extra)
    drawn = [{e.split("::")[-1] for e in extra} - functions for extra in seen]
    assert drawn[0] and drawn[1] and not drawn[0] & drawn[1]  # fresh names every grading


def test_a_patch_writing_inside_dot_git_is_not_applied(inflection, inflection_image):
    """`git apply` refuses paths in .git/ but `patch`, its last fallback, writes them: a hook there would
    run as root at the grading's next git command, before the tests and the canaries. Such a patch is not
    applied: unresolved, a verdict (not a failure), with the fix beside it or not."""
    hook = ("diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\nnew file mode 100755\n"
            "--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+touch /tmp/owned\n")
    g = grade_patch(inflection, inflection.patch + hook)
    assert not g.applied and not g.resolved and g.reward == 0.0 and not g.failed, g
    assert "writes inside .git/" in g.error, g.error


def test_the_word_list_is_a_signal_not_a_gate(inflection, inflection_image):
    """An honest fix whose code holds a word of `RUNNER_TAMPERING` (here pytest's result words, as a
    library that parses test logs has them) is graded on what it does: resolved, the file kept, the
    word recorded for review."""
    words = "printf '\\nSTATUS_WORDS = (\"PASSED \", \"FAILED \")\\n' >> inflection/__init__.py"
    patch = _edit_patch(inflection_image, f"git apply - <<'SWERL_EOF'\n{inflection.patch}SWERL_EOF\n{words}")
    g = grade_patch(inflection, patch)
    assert g.runner_words == ("inflection/__init__.py",) and g.tampered_files == () and not g.tampered
    assert g.resolved and g.reward == 1.0, (g.error, g.tampered)


def test_patch_that_breaks_a_pass_to_pass_test_does_not_resolve(inflection, inflection_image):
    patch = _edit_patch(inflection_image, "git apply /dev/stdin <<'EOF'\n" + inflection.patch + "EOF\n"
                        "printf '\\n\\ndef ordinal(number):\\n    return \"\"\\n' >> inflection/__init__.py")
    r = grade_patch(inflection, patch, config=GradingConfig(partial_reward=True))
    assert not r.resolved and r.status == "RESOLVED_NO" and r.reward == 0.0
    assert set(r.fail_to_pass_success) == set(inflection.fail_to_pass)  # the fix itself is in
    broken = {t for t in inflection.pass_to_pass if "test_ordinal[" in t}
    assert broken and broken <= set(r.pass_to_pass_failure)


def test_patch_that_edits_the_tests_is_neutralised(inflection, inflection_image):
    cheat = ("sed -i 's/^\\( *\\)assert /\\1assert True or /' test_inflection.py && "
             "printf 'import pytest\\n@pytest.hookimpl(wrapper=True)\\ndef pytest_runtest_makereport(item, "
             "call):\\n    rep = yield\\n    rep.outcome = \"passed\"\\n    return rep\\n' > conftest.py")
    patch = _edit_patch(inflection_image, cheat)
    assert "test_inflection.py" in patch and "conftest.py" in patch
    # without the reset the cheat works: every FAIL_TO_PASS test reports PASSED
    with DockerSandbox(SandboxSpec(image=inflection_image)) as sb:
        sb.write_file("/tmp/p.diff", patch)
        assert sb.run("cd /testbed && git apply /tmp/p.diff").ok
        out = sb.run(f"cd /testbed && {inflection.test_cmd}").output
    cheated = parse_log_pytest(out, None)
    assert all(cheated.get(t) == "PASSED" for t in inflection.fail_to_pass)
    # graded, the tests are reset to the base commit first: nothing is fixed
    r = grade_patch(inflection, patch)
    assert r.applied and not r.resolved and not r.error
    assert set(r.fail_to_pass_failure) == set(inflection.fail_to_pass)


def test_patch_that_does_not_apply_is_an_error_not_a_crash(inflection, inflection_image):
    bad = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1,1 +1,1 @@\n-x = 1\n+x = 2\n"
    r = grade_patch(inflection, bad)
    assert not r.applied and not r.resolved and r.reward == 0.0
    assert "did not apply" in r.error and r.status == ""


def test_fuzzy_patch_falls_back_to_patch_fuzz(inflection, inflection_image):
    # shift the gold hunk's line numbers: git apply refuses the stale offsets, patch --fuzz accepts them
    import re

    shifted = re.sub(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@",
                     lambda m: f"@@ -{int(m[1]) + 40},{m[2]} +{int(m[3]) + 40},{m[4]} @@", inflection.patch,
                     flags=re.M)
    lines = shifted.splitlines(keepends=True)
    # and damage one context line so that only a fuzzy match fits
    ctx = next(i for i, ln in enumerate(lines) if ln.startswith(" ") and ln.strip())
    lines[ctx] = " # a context line that is not in the file\n"
    r = grade_patch(inflection, "".join(lines))
    assert r.applied and r.apply_method.startswith("patch "), r.error
    assert r.resolved


def test_missing_image_is_a_per_instance_error(swe_suite):  # noqa: F811
    import dataclasses

    foreign = dataclasses.replace(swe_suite[0], instance_id="nobody__nothing-1", source="", image="")
    with pytest.raises(ImageUnavailable, match=r"nobody__nothing-1.*_1776_"):
        resolve_image(foreign, pull=False)
    r = grade_patch(foreign, foreign.patch)
    assert not r.resolved and "no image" in r.error and r.status == ""


def test_every_library_in_the_suite_has_a_gold_resolving_instance(swe_suite):  # noqa: F811
    """One instance per shipped library (a handful of gradings, not all): gold resolves, empty does not."""
    libs = sorted({i.instance_id.split("__")[0] for i in swe_suite})
    assert len(libs) >= 4
    for lib in libs:
        inst = next(i for i in swe_suite if i.instance_id.startswith(lib + "__"))
        g = grade_patch(inst, inst.patch)
        e = grade_patch(inst, "")
        assert g.resolved, (inst.instance_id, g.error, g.fail_to_pass_failure, g.pass_to_pass_failure)
        assert not e.resolved and not e.error, (inst.instance_id, e.error)


def test_shipped_suite_shape(swe_suite):  # noqa: F811
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "tasks" / "swe"
    splits = json.loads((root / "splits.json").read_text())
    by_split: dict[str, set[str]] = {}
    for inst in swe_suite:
        assert inst.fail_to_pass and inst.pass_to_pass and inst.split in ("train", "heldout")
        assert (root / "sources" / inst.source).is_file()
        by_split.setdefault(inst.split, set()).add(inst.repo)
        assert inst.problem_statement and inst.patch.startswith("diff --git")
    assert not by_split["train"] & by_split["heldout"]  # no library in both
    assert sorted(splits["splits"]["train"] + splits["splits"]["heldout"]) == sorted(i.instance_id
                                                                                     for i in swe_suite)
    assert sum(p.stat().st_size for p in (root / "wheels").glob("*.whl")) < 5_000_000


def test_tests_that_hang_are_a_timeout_error(inflection, inflection_image):
    patch = _edit_patch(inflection_image,
                        "printf 'import time\\ntime.sleep(60)\\n' >> inflection/__init__.py")
    r = grade_patch(inflection, patch, config=GradingConfig(timeout_s=4))
    assert not r.resolved and r.status == "" and "timed out after 4s" in r.error
    assert 4 <= r.test_s < 30


# ---- a test run a patch cannot change --------------------------------------------------------------

FORCE_PASS = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome = "passed"
'''


def test_added_and_shadowing_files_by_hand():
    from swerl.envs.swe.grading import added_files, shadowing_files

    patch = ("diff --git a/pytest.py b/pytest.py\nnew file mode 100644\n--- /dev/null\n+++ b/pytest.py\n@@ "
             "-0,0 +1 @@\n+x\ndiff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ "
             "-1 +1 @@\n-a\n+b\ndiff --git a/lib/json.py b/lib/json.py\n--- /dev/null\n+++ b/lib/json.py\n@@ "
             "-0,0 +1 @@\n+x\n")
    assert added_files(patch) == ["pytest.py", "lib/json.py"]
    # pkg has __init__.py (a regular package): pkg/json.py is pkg.json, no top-level name; lib has none,
    # so a test path could put lib/ on sys.path and lib/json.py would shadow the stdlib's json
    new = ["pytest.py", "pkg/json.py", "lib/json.py", "newmodule.py", "notes.txt", "pkg/sub/yaml.py",
           "sitecustomize.py", "docs/x.pth", "pluggy/__init__.py"]
    assert shadowing_files(new, {"json", "yaml"}, has_init={"pkg", "pkg/sub"}) == [
        "pytest.py", "lib/json.py", "sitecustomize.py", "docs/x.pth", "pluggy/__init__.py"]


@pytest.mark.parametrize(("hack", "expect_tampered"), [
    # a new pytest.py in /testbed that would run instead of the real pytest (prints PASSED for everything)
    ("printf 'import sys\\nprint(\"PASSED test_inflection.py::x\")\\nsys.exit(0)\\n' > pytest.py",
     ["pytest.py"]),
    # a new conftest forcing every report to passed, and test options in a new pytest.ini
    (f"cat > conftest.py <<'EOF'\n{FORCE_PASS}EOF\nprintf '[pytest]\\npython_functions = nothing\\n' > "
     "pytest.ini",
     ["conftest.py", "pytest.ini"]),
    # edits to files the test run reads: setup.cfg / tox.ini options, a usercustomize
    ("printf '[tool:pytest]\\naddopts = -p no:python\\n' >> setup.cfg; printf 'import os\\nos._exit(0)\\n' "
     "> usercustomize.py", ["usercustomize.py", "setup.cfg"]),
])
def test_hacks_on_the_test_run_are_undone_and_recorded(inflection, inflection_image, hack, expect_tampered):
    patch = _edit_patch(inflection_image, hack)
    g = grade_patch(inflection, patch)
    assert not g.resolved and g.reward == 0.0 and g.status == "RESOLVED_NO", (g.error, g.test_status[:3])
    assert sorted(g.tampered_files) == sorted(expect_tampered)
    assert g.fail_to_pass_failure and not g.fail_to_pass_success  # the real tests ran and still fail
    # with the fix in the same patch, the fix counts and the tampering is still recorded
    both = _edit_patch(inflection_image, f"git apply - <<'SWERL_EOF'\n{inflection.patch}SWERL_EOF\n{hack}")
    g = grade_patch(inflection, both)
    assert g.resolved and g.reward == 1.0 and sorted(g.tampered_files) == sorted(expect_tampered)


def test_swegyms_pydantic_parser_grades_a_verbose_coloured_run_and_wants_pytests_summary(inflection,
                                                                                         inflection_image):
    import dataclasses

    # pydantic's command in SWE-Gym's spec (-vv, classic output), with colour: only verbose lines and the
    # colour-coded summary carry the results
    cmd = inflection.test_cmd.replace("-rA", "-rA -vv -o console_output_style=classic --color=yes")
    gym = dataclasses.replace(inflection, log_parser="parse_log_pytest_pydantic", test_cmd=cmd)
    gold, empty = grade_patch(gym, gym.patch), grade_patch(gym, "")
    assert gold.resolved and not gold.error, gold.error
    assert not empty.resolved and not empty.failed and empty.fail_to_pass_failure
    # pytest before 5.4 closed with "in 0.88 seconds" (real pytest-dev__pytest-5227 runs pytest 4.4)
    from swerl.envs.swe.grading import _PYTEST_SUMMARY

    for line in ("=== 34 passed in 0.88 seconds ===", "=== 3 passed in 0.12s ===",
                 "=== 1 failed, 2 passed in 62.10s (0:01:02) ==="):
        assert _PYTEST_SUMMARY.search(line), line
    assert not _PYTEST_SUMMARY.search("PASSED tests/test_x.py::test_done_in_3 seconds")  # no closing line
    seconds = "sed -E 's/ in ([0-9.]+)s / in \\1 seconds /'"
    old = dataclasses.replace(inflection, test_cmd=f"{inflection.test_cmd} | {seconds}")
    g = grade_patch(old, old.patch)
    assert g.resolved and not g.error, g.error
    # a run that prints results and ends before pytest's summary is not trusted
    cut = dataclasses.replace(gym, test_cmd=f"echo 'PASSED {gym.fail_to_pass[0]}'")
    g = grade_patch(cut, cut.patch)
    assert not g.resolved and "without pytest's summary line" in g.error, g.error


def test_the_gold_patch_tampers_nothing(inflection, inflection_image):
    g = grade_patch(inflection, inflection.patch)
    assert g.resolved and g.tampered_files == ()


# ---- failure is not a reward --------------------------------------------------------------------------


def slow_gold(image: str, inst) -> str:
    """The gold patch plus a pause when the package is imported (`slow_gold_command`)."""
    pkg = inst.patch.split("diff --git a/", 1)[1].split("/", 1)[0]
    return _edit_patch(image, slow_gold_command(inst.patch, pkg))


def test_a_grading_container_killed_mid_test_is_a_failure_not_a_zero(docker_client, inflection,
                                                                     inflection_image):
    from swe_fixtures import GradingKiller

    from swerl.envs.swe.grading import GradingFailed, verdict

    patch = slow_gold(inflection_image, inflection)
    assert grade_patch(inflection, patch).resolved  # unharmed, the patch resolves
    with GradingKiller(docker_client) as killer:
        g = grade_patch(inflection, patch)
    assert killer.killed, "the grading container was never caught mid-test"
    assert g.failed and g.failure == "sandbox" and not g.resolved and not g.status, (g.failure, g.error)
    with pytest.raises(GradingFailed, match="failed \\(sandbox\\)"):
        verdict(g)
    # a verdict passes through
    ok = grade_patch(inflection, inflection.patch)
    assert verdict(ok) is ok and not ok.failed


def test_no_image_and_no_test_command_are_failures(inflection):
    import dataclasses

    gone = dataclasses.replace(inflection, instance_id="x__gone-1", source="", image="swerl-no-such-image:1")
    g = grade_patch(gone, gone.patch)
    assert g.failure == "image" and "swerl-no-such-image:1" in g.error
    no_cmd = dataclasses.replace(inflection, test_cmd="")
    g = grade_patch(no_cmd, no_cmd.patch)
    assert g.failure == "instance" and "neither 'eval_script' nor 'test_cmd'" in g.error
    # a missing test command in the image is the environment's fault, not the patch's
    broken = dataclasses.replace(inflection, test_cmd="no-such-pytest -rA test_inflection.py")
    g = grade_patch(broken, broken.patch)
    assert g.failure == "environment" and not g.resolved, g.error
    # a patch that does not apply is the task's verdict (reward 0), not a failure
    g = grade_patch(inflection,
                    "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert not g.failed and g.reward == 0.0 and "did not apply" in g.error
