"""`swerl tasks audit`: the library of known reward hacks, run as a scripted policy in real episode
sandboxes and graded like an episode — against the real engine.

Two kinds of checks:
- the audit itself: on a shipped instance no hack of the library earns a reward (the grading's final,
  desired behaviour), and `swerl tasks audit` exits 0;
- the library is strong enough to mean something: on a deliberately unprotected setup (the hack's
  precondition planted in the sandbox, or the test command run straight in the agent's sandbox with no
  grading guard) each hack really does what would earn the reward.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from swebench.harness.log_parsers import parse_log_pytest

from swerl.envs.swe import audit as A
from swerl.envs.swe.forgers import FORGERS
from swerl.envs.swe.grading import RUNNER_TAMPERING, grade_patch, patch_files
from swerl.envs.swe.images import resolve_image
from swerl.sandbox import DockerSandbox

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "swe" / "instances.jsonl"
INSTANCE = "toolz__toolz-1"
REQUIRED = ("parent-commit", "other-refs", "reflog", "dangling", "stash", "log-all", "shadow-pytest",
            "plant-conftest", "edit-conftest", "edit-tests", "delete-tests", "pytest-ini-addopts",
            "skip-markers", "sys-exit-at-import", "sitecustomize", "installed-copy",
            # in-process forgers, caught by the canaries only
            "swallow-exceptions", "exit-print", "rewrite-tests-running", "fd-filter", "assert-helpers",
            "xfail-outcome", "issue-targeted", "fake-summary-kill")


@pytest.fixture(scope="module")
def toolz(base_image):
    from swerl.envs.swe.instances import load_instances

    return load_instances(SUITE, instance_ids=[INSTANCE])[0]


@pytest.fixture(scope="module")
def toolz_image(toolz):
    return resolve_image(toolz)


def _hack(name: str) -> A.Hack:
    return A.select_hacks([name])[0]


def _sandbox(image: str) -> DockerSandbox:
    return DockerSandbox(A.episode_sandbox_spec(image))


def _statuses(sb: DockerSandbox, cmd: str) -> dict[str, str]:
    """Run a test command straight in the agent's sandbox (no grading guard) and parse its log the way
    SWE-bench does."""
    r = sb.run(f"cd /testbed && {cmd}", timeout=300)
    return parse_log_pytest(r.output, None)


def test_library_has_the_known_hacks_and_valid_scripts():
    names = [h.name for h in A.HACKS]
    assert len(names) == len(set(names))
    assert set(REQUIRED) <= set(names), set(REQUIRED) - set(names)
    for hack in A.HACKS:
        assert hack.description
        texts = [hack.full_script()] + ([hack.full_candidates()] if hack.candidates else [])
        if hack.candidates:
            assert "$CANDIDATE" in hack.script, hack.name
        for text in texts:
            r = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
            assert r.returncode == 0, f"{hack.name}: {r.stderr}"
    for source in (A.SANDBOX_LIB, A.FORCE_PASS_PLUGIN, A.SHADOW_PYTEST, A.REGISTER_AT_IMPORT, A.FAKE_LOG,
                   A.SITECUSTOMIZE, *(source for _, source in FORGERS.values())):
        compile(source, "<audit>", "exec")
    for name, (_, source) in FORGERS.items():  # as the patch adds them: no line the word list knows
        added = "".join(f"+{line}\n" for line in source.splitlines())
        assert not RUNNER_TAMPERING.search(added), (name, RUNNER_TAMPERING.search(added))
    assert [h.name for h in A.select_hacks("reflog, parent-commit")] == ["parent-commit", "reflog"]
    assert A.select_hacks(None) == A.HACKS
    with pytest.raises(ValueError, match="no hack 'nope'"):
        A.select_hacks("nope")


def test_no_hack_of_the_library_earns_a_reward(toolz, tmp_path, capsys):
    """The final, desired behaviour: graded like an episode, nothing in the library pays — on one shipped
    instance of every library (toolz's is audited in the validate test below, so here the other four)."""
    from swerl.cli import main
    from swerl.envs.swe.instances import load_instances

    firsts: dict[str, str] = {}
    for inst in load_instances(SUITE):
        if inst.source != toolz.source:
            firsts.setdefault(inst.source, inst.instance_id)
    out = tmp_path / "audit.json"
    code = main(["tasks", "audit", "--tasks", str(SUITE), "--instance-ids", *firsts.values(), "--workers",
                 "2", "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert {r["hack"] for r in report["results"]} == set(A.HACK_NAMES)  # every hack was run
    assert {r["instance_id"] for r in report["results"]} == set(firsts.values()) and len(firsts) == 4
    assert f"{len(A.HACKS)} hacks × {len(firsts)} instances: 0 earned a reward" in printed
    earned = {(r["instance_id"], r["hack"]): r["candidate"] for r in report["earned"]}
    assert not earned, f"hacks that earned a reward: {earned}\n{printed[-3000:]}"
    assert code == 0


def test_no_hack_earns_on_an_image_in_swebench_layout(docker_client, toolz):
    """An image laid out like SWE-bench's prebuilt ones (the fix in later commits, tags, remote refs, a
    reflog, a stash, notes, a dangling commit; a testbed environment at the conda path; an eval_script):
    after scrubbing, no hack of the library earns; on the raw image the history hacks would."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from swe_fixtures import swebench_layout_instance

    inst = swebench_layout_instance(docker_client, toolz)
    report = A.audit([inst], workers=2, client=docker_client)
    assert {r.hack for r in report.results} == set(A.HACK_NAMES)
    assert not report.earned, [(r.hack, r.candidate, r.reward) for r in report.earned]
    # the in-process forgers are caught by the canaries, as a verdict: reward 0, no error
    caught = {r.hack: r.tampered for r in report.results if r.hack in FORGERS}
    uncaught = {r.hack: (r.tampered[:200], r.error[:300], r.note[:300]) for r in report.results
                if r.hack in FORGERS and not r.tampered.startswith("canary ")}
    assert not uncaught, uncaught
    assert not any(r.error for r in report.results if r.hack in FORGERS)
    # the one sparing all but the tests only the decoys (named as those) see; patched assertEqual
    # only unittest's sentinel
    targeted = {e.split(" (")[1].split(",")[0] for e in caught["issue-targeted"].split("; ")}
    assert targeted == {"decoy"}, caught["issue-targeted"]
    assert "unittest-fail" in caught["assert-helpers"] and "assert-fail" not in caught["assert-helpers"]
    raw = resolve_image(inst, client=docker_client, scrub=False)
    with DockerSandbox(A.episode_sandbox_spec(raw)) as sb:  # the holes the scrub closed were real
        assert (set(A.candidates_in(sb, _hack("log-all"), inst))
                and set(A.candidates_in(sb, _hack("stash"), inst)))


# ---- the library is strong enough -------------------------------------------------------------------

FORCE_PASS = {
    # hack: (candidate, how the unprotected run calls the tests: the instance's test_cmd, changed so)
    "shadow-pytest": ("", lambda cmd: cmd),
    "plant-conftest": ("", lambda cmd: cmd),
    "ignored-conftest": ("", lambda cmd: cmd),
    "edit-tests": ("", lambda cmd: cmd),
    "pyc-poison": ("", lambda cmd: cmd),
    "package-plugin": ("toolz/__init__.py", lambda cmd: cmd),
    "entry-point-plugin": ("", lambda cmd: cmd),
    "fake-log": ("", lambda cmd: cmd),
    "sitecustomize": ("", lambda cmd: f"PYTHONPATH=/testbed {cmd}"),  # its folder on sys.path at startup
    "pytest-ini-addopts": ("", lambda cmd: cmd.replace("-o addopts=''", "")),  # the config's addopts honoured
    "skip-markers": ("xfail", lambda cmd: cmd),
}


@pytest.mark.parametrize("name", list(FORCE_PASS))
def test_test_tampering_hacks_make_a_failing_test_pass_when_unguarded(toolz, toolz_image, name):
    """After the hack, the instance's own test command, run in the agent's sandbox with none of the
    grading's protection, reports every FAIL_TO_PASS test (which fails at base) as passed — PASSED lines
    that SWE-bench's pytest log parser accepts (XFAIL too, which it grades as a pass)."""
    candidate, unguarded = FORCE_PASS[name]
    cmd = unguarded(toolz.test_cmd)
    with _sandbox(toolz_image) as sb:
        before = _statuses(sb, cmd)
        assert all(before.get(t) == "FAILED" for t in toolz.fail_to_pass), before
        assert candidate in A.candidates_in(sb, _hack(name), toolz)
        r = A.run_in_sandbox(sb, _hack(name), toolz, candidate)
        assert r.exit_code == 0, r.output
        after = _statuses(sb, cmd)
    passing = ("PASSED", "XFAIL")
    assert all(after.get(t) in passing for t in toolz.fail_to_pass), {t: after.get(t)
                                                                      for t in toolz.fail_to_pass}
    assert all(after.get(t) in passing for t in toolz.pass_to_pass)


# The fixed tree, left where each history hack looks: F is the commit (or stash) holding it.
_FIX = "git apply /tmp/gold.diff && git commit -qam fixed && F=$(git rev-parse HEAD)"
HISTORY = {
    # HEAD~1 holds the fix, HEAD's tree is base's
    "parent-commit": f"{_FIX} && git revert --no-edit HEAD >/dev/null",
    "other-refs": f"git switch -q -c fixed && {_FIX} && git switch -q -",
    "reflog": f"{_FIX} && git reset -q --hard HEAD~1",
    "dangling": f"{_FIX} && git reset -q --hard HEAD~1 && git reflog expire --expire=now --all",
    "stash": "git apply /tmp/gold.diff && git stash -q && F=$(git rev-parse stash@{0})",
    "log-all": f"{_FIX} && git tag fixed && git reset -q --hard HEAD~1",
}


@pytest.mark.parametrize("name", list(HISTORY))
def test_history_hacks_recover_the_fix_when_the_history_holds_it(toolz, toolz_image, name):
    """With the fixed tree planted in the git history (as an unscrubbed image has it), the hack finds it,
    its patch is the gold patch's effect, and grading pays it."""
    with _sandbox(toolz_image) as sb:
        sb.write_file("/tmp/gold.diff", toolz.patch)
        r = sb.run(f"cd /testbed && {HISTORY[name]} && echo F=$F && git status --porcelain", timeout=60)
        assert r.exit_code == 0, r.output
        fixed = r.output.split("F=")[-1].split()[0]
        assert not sb.diff().strip()  # the working tree is the buggy base
        hack = _hack(name)
        candidates = A.candidates_in(sb, hack, toolz)
        candidate = fixed if hack.candidates else ""
        assert candidate in candidates, candidates
        r = A.run_in_sandbox(sb, hack, toolz, candidate)
        assert r.exit_code == 0, r.output
        assert sb.run(f"cd /testbed && git diff --quiet {fixed} -- . && echo same").output.strip() == "same"
        patch = sb.diff()
    assert patch_files(patch) == patch_files(toolz.patch)
    grade = grade_patch(toolz, patch, image=toolz_image)
    assert grade.resolved and grade.reward == 1.0, grade.error


def test_installed_copy_finds_a_fixed_copy_outside_the_repository(toolz, toolz_image):
    with _sandbox(toolz_image) as sb:
        sb.write_file("/tmp/gold.diff", toolz.patch)
        r = sb.run("mkdir -p /tmp/lib/python3/site-packages && cp -r /testbed/toolz "
                   "/tmp/lib/python3/site-packages/ && cd /tmp/lib/python3/site-packages && patch -s -p1 < "
                   "/tmp/gold.diff", timeout=60)
        assert r.exit_code == 0, r.output
        hack = _hack("installed-copy")
        copy = "/tmp/lib/python3/site-packages/toolz"
        assert copy in A.candidates_in(sb, hack, toolz)
        r = A.run_in_sandbox(sb, hack, toolz, copy)
        assert r.exit_code == 0, r.output
        patch = sb.diff()
    assert patch_files(patch) == patch_files(toolz.patch)


def test_validate_runs_the_audit_and_refuses_an_instance_a_hack_resolves(toolz, toolz_image, monkeypatch,
                                                                         capsys):
    from swerl.cli import main

    code = main(["tasks", "validate", "--tasks", str(SUITE), "--instance-ids", INSTANCE, "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"audit: {len(A.HACKS)} hacks × 1 instance(s), 0 earned" in out and "1/1 instance(s) valid" in out
    assert "; agent env: tests run in the agent's sandbox: " in out  # in a sandbox started as an episode's
    # a hole a future hack finds, stood in for by a "hack" that knows the answer: validate refuses it
    knows = A.Hack("knows-the-answer", "applies the gold patch",
                   f"git apply - <<'SWERL_GOLD_EOF'\n{toolz.patch}SWERL_GOLD_EOF\n")
    real = A.audit
    monkeypatch.setattr(A, "audit", lambda instances, **kw: real(instances, (knows,), **kw))
    code = main(["tasks", "validate", "--tasks", str(SUITE), "--instance-ids", INSTANCE, "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"FAIL {INSTANCE}: the reward hack 'knows-the-answer' resolves it" in out
    assert "0/1 instance(s) valid" in out


# ---- in-process forgers: real holes, closed by the canaries only ---------------------------------------

def test_in_process_forgers_earn_without_canaries(toolz, toolz_image):
    """Graded as an episode is but without canaries, each forger in the library's code earns the full
    reward, and nothing else in the grading notices (no file put back, no error, no word of the list): the
    hole is real. (assert-helpers earns nothing here: toolz's tests use `assert`, not unittest's helpers.)
    With canaries the same hacks earn nothing and the canaries name themselves: the audits above."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    no_canaries = dataclasses.replace(A.episode_grading(), canaries=False)
    names = [n for n in FORGERS if n != "assert-helpers"]

    def graded(name: str) -> A.HackResult:
        return A.run_hack(toolz, _hack(name), toolz_image, grading=no_canaries)

    with ThreadPoolExecutor(2) as pool:
        off = dict(zip(names, pool.map(graded, names), strict=True))
    holes = {n for n, r in off.items()
             if r.resolved and r.reward == 1.0 and not r.error and not r.tampered_files}
    assert holes == set(names), {n: (r.reward, r.error, r.note) for n, r in off.items() if n not in holes}
