"""Scrubbed task images: no commit, ref, reflog entry, stash, note, dangling object, installed copy or
archive the agent can reach holds the fixed files; images that cannot be scrubbed are refused by name."""

from __future__ import annotations

import pytest
from swe_fixtures import swe_suite, swebench_layout_instance, swesmith_layout_instance  # noqa: F401

from swerl.envs.swe.env import SWEEnv, check_agent_environment
from swerl.envs.swe.grading import grade_patch
from swerl.envs.swe.images import ImageUnavailable, resolve_image
from swerl.sandbox import DockerSandbox, SandboxSpec

pytestmark = pytest.mark.docker

TASK = "toolz__toolz-1"
GIT = "git -c safe.directory='*' -C /testbed"


@pytest.fixture(scope="module")
def toolz(swe_suite):  # noqa: F811 (the fixture)
    return next(i for i in swe_suite if i.instance_id == TASK)


def _fixed_blobs(sb, inst):
    """The git blob ids of the files the gold patch changes, as they are after the patch (computed in a
    throwaway copy of the repository, outside the image's own object store)."""
    sb.write_file("/tmp/fix.diff", inst.patch)
    r = sb.run("rm -rf /tmp/copy && cp -r /testbed /tmp/copy && cd /tmp/copy && git apply /tmp/fix.diff && "
               "git add -A && git diff --cached --raw --no-abbrev | awk '{print $4}'")
    assert r.ok, r.output
    return r.output.split()


def _holdings(sb):
    """Every object id the repository can reach or still stores, and every ref / reflog / stash entry."""
    return sb.run(f"{GIT} cat-file --batch-all-objects --batch-check='%(objectname)'; {GIT} for-each-ref; "
                  f"{GIT} reflog --all; {GIT} stash list; {GIT} log --all --format=%H").output


def test_the_swebench_layout_fixture_really_holds_the_fix_before_scrubbing(docker_client, toolz):
    inst = swebench_layout_instance(docker_client, toolz)
    raw = resolve_image(inst, client=docker_client, scrub=False)
    with DockerSandbox(SandboxSpec(image=raw), client=docker_client) as sb:
        fixed = _fixed_blobs(sb, inst)
        held = _holdings(sb)
        assert fixed and all(f in held for f in fixed)  # every later-commit route is open here
        for route in ("refs/tags/v-fixed", "refs/remotes/origin/main", "refs/stash", "refs/notes/commits"):
            assert route in held, route


@pytest.mark.parametrize("variant", ["future-fix", "parent-fix", "setup-commit"])
def test_scrubbed_images_hold_no_fixed_file_and_keep_git_working(docker_client, toolz, variant):
    inst = swebench_layout_instance(docker_client, toolz, variant=variant)
    image = resolve_image(inst, client=docker_client)
    built = docker_client.images.get(image).id
    assert resolve_image(inst, client=docker_client) == image  # cached by content hash: no rebuild
    assert docker_client.images.get(image).id == built
    with DockerSandbox(SandboxSpec(image=image), client=docker_client) as sb:
        fixed = _fixed_blobs(sb, inst)
        held = _holdings(sb)
        assert fixed and not any(f in held for f in fixed)
        refs = sb.run(f"{GIT} for-each-ref --format='%(refname)'").output.split()
        assert refs == ["refs/heads/main"]
        head = sb.run(f"{GIT} rev-parse HEAD").output.strip()
        assert sb.run(f"{GIT} status --porcelain").output.strip() == ""
        log = sb.run(f"{GIT} log --format=%s").output.strip().split("\n")
        # history behind HEAD stays unless the fix is in it; blame works either way
        if variant == "setup-commit":  # SWE-bench's setup commit stays HEAD, and the agent starts there
            assert sb.run(f"{GIT} rev-parse HEAD~1").output.strip() == inst.base_commit
            assert head == sb.base_commit != inst.base_commit and log[0] == "SWE-bench"
            log = log[1:]
        else:
            assert head == inst.base_commit == sb.base_commit
        assert log[0] == "base: unrelated docs change"
        assert len(log) == (1 if variant == "parent-fix" else 3), log
        assert sb.run(f"{GIT} blame -L1,1 HISTORY.txt").ok
        assert sb.run("ls ~/.cache/pip /root/.cache/pip 2>&1; ls /opt/miniconda3/envs/testbed/bin/python").ok
    # the scrubbed image still grades like the original: the gold patch resolves, the empty one does not
    gold = grade_patch(inst, inst.patch, client=docker_client)
    empty = grade_patch(inst, "", client=docker_client)
    assert gold.resolved and gold.reward == 1.0 and not gold.error, gold.error
    assert not empty.resolved and empty.reward == 0.0


def test_agents_on_swebench_images_run_as_a_user_who_cannot_rob_the_harness(docker_client, toolz):
    """SWE-bench's images run as root, and a root command can open the harness shell's stdin through
    /proc and read the next command's nonce. The scrubbed layer gives the agent a user of its own who
    owns /testbed; grading keeps running as root."""
    inst = swebench_layout_instance(docker_client, toolz)
    raw = docker_client.images.get(resolve_image(inst, client=docker_client, scrub=False))
    assert (raw.attrs["Config"].get("User") or "root") == "root" and not raw.labels.get("swerl.user")
    image = resolve_image(inst, client=docker_client)
    assert docker_client.images.get(image).labels["swerl.user"] == "swerl"
    with DockerSandbox(SandboxSpec(image=image), client=docker_client) as sb:
        who = sb.run("id -u; id -un; stat -c %U /testbed /testbed/.git "
                     "/testbed/toolz/itertoolz.py").output.split()
        assert who[0] != "0" and who[1:] == ["swerl"] * 4, who
        r = sb.run("timeout 2 cat /proc/$PPID/fd/0; kill -9 $PPID; echo rc=$?", timeout=20)
        assert not r.timed_out and "fd/0: Permission denied" in r.output and r.output.endswith("rc=1\n")
        # the agent's work still works: edit and commit-free diff in its own tree, git status, the env's
        # python
        assert sb.run("echo '# note' >> /testbed/toolz/itertoolz.py && git -C /testbed status "
                      "--porcelain").output \
            == " M toolz/itertoolz.py\n"
        SWEEnv(sb, inst).reset()  # activates the testbed environment, as for an episode
        assert (sb.run("python -c 'import sys; print(sys.prefix)'").output.strip()
                == "/opt/miniconda3/envs/testbed")
    # the eval script (git checkout of the test files, then pytest) runs as root over the agent's tree
    gold = grade_patch(inst, inst.patch, client=docker_client)
    assert gold.resolved and not gold.error, gold.error


def test_untracked_image_files_stay_out_of_diffs_and_grader_files_out_of_reach(docker_client, toolz):
    inst = swebench_layout_instance(docker_client, toolz, variant="grader-files")
    image = resolve_image(inst, client=docker_client)
    with DockerSandbox(SandboxSpec(image=image), client=docker_client) as sb:
        # still there for the agent to use
        assert sb.run("cat /testbed/run_tests.sh").output == "pytest -rA\n"
        assert sb.run("git -C /testbed status --porcelain").output == ""
        sb.run("echo x > /testbed/.venv/bin/tool && echo y >> /testbed/run_tests.sh && echo z > "
               "/testbed/new.txt")
        # only the agent's own file: not the runner it appended to, nor the environment's .venv
        assert [ln for ln in sb.diff().splitlines() if ln.startswith("diff --git")] == \
            ["diff --git a/new.txt b/new.txt"]
        r = sb.run("cat /r2e_tests/test_hidden.py; ls /r2e_tests")
        assert r.output == ("cat: /r2e_tests/test_hidden.py: Permission denied\n"
                            "ls: cannot open directory '/r2e_tests': Permission denied\n")
        with pytest.raises(PermissionError):
            sb.read_file("/r2e_tests/test_hidden.py")
    with DockerSandbox(SandboxSpec(image=image, user="root"), client=docker_client) as sb:  # as grading runs
        assert sb.run("cat /r2e_tests/test_hidden.py").output == "def test_hidden(): pass\n"


def test_a_swesmith_image_starts_from_its_bug_committed_onto_its_head(docker_client, toolz):
    inst = swesmith_layout_instance(docker_client, toolz)
    with DockerSandbox(SandboxSpec(image=inst.image, user="root"), client=docker_client) as sb:
        clean = sb.base_commit
    image = resolve_image(inst, client=docker_client)
    with DockerSandbox(SandboxSpec(image=image), client=docker_client) as sb:
        assert sb.base_commit and sb.base_commit != clean
        assert sb.run(f"{GIT} log --format=%s").output == "swerl: the task's start state\n"
        assert not sb.run(f"{GIT} cat-file -e {clean}").ok  # the clean mirror commit is cut away
        assert sb.run(f"{GIT} status --porcelain").output == ""
        sb.write_file("/tmp/gold.diff", inst.patch)
        assert sb.run("cd /testbed && git apply --check /tmp/gold.diff").ok  # the bug is what the gold fixes
        assert not any(f in _holdings(sb) for f in _fixed_blobs(sb, inst))
    check = check_agent_environment(inst, client=docker_client)
    assert check.ok, check.detail  # FAIL_TO_PASS fail and PASS_TO_PASS pass from the start state
    gold = grade_patch(inst, inst.patch, client=docker_client)
    empty = grade_patch(inst, "", client=docker_client)
    assert gold.resolved and not gold.error, gold.error
    assert not empty.resolved and empty.reward == 0.0 and not empty.failure


@pytest.mark.parametrize(("variant", "says"), [
    ("installed-copy", "the fixed files are in the image outside the repository: "
                       "/usr/local/lib/python3.11/dist-packages/toolz/"),
    ("no-git", "git is not installed in the image"),
    ("other-commit", "not the instance's base_commit"),
])
def test_an_image_that_cannot_be_scrubbed_is_refused_by_name(docker_client, toolz, variant, says):
    inst = swebench_layout_instance(docker_client, toolz, variant=variant)
    with pytest.raises(ImageUnavailable) as e:
        resolve_image(inst, client=docker_client)
    msg = str(e.value)
    assert inst.image in msg and "cannot be scrubbed" in msg and says in msg, msg
    # the grade is an error naming the image, never a reward (nothing ran)
    g = grade_patch(inst, inst.patch, client=docker_client)
    assert not g.resolved and g.reward == 0.0 and "cannot be scrubbed" in g.error


def test_head_not_at_base_commit_is_refused(docker_client, toolz):
    import dataclasses

    inst = swebench_layout_instance(docker_client, toolz)
    wrong = dataclasses.replace(inst, instance_id=inst.instance_id + "-wrong-base", base_commit="1" * 40)
    with pytest.raises(ImageUnavailable,
                       match=f"HEAD is {inst.base_commit}, not the instance's base_commit 1111"):
        resolve_image(wrong, client=docker_client)


def test_shipped_offline_images_have_no_clean_release_in_history(docker_client, toolz):
    image = resolve_image(toolz, client=docker_client)
    with DockerSandbox(SandboxSpec(image=image), client=docker_client) as sb:
        assert not sb.run(f"{GIT} rev-parse -q --verify HEAD~1").ok  # the buggy tree is the root commit
        assert not any(f in _holdings(sb) for f in _fixed_blobs(sb, toolz))


def test_the_programs_run_on_the_images_python_parse_as_python_3_5():
    """The fixed-file search and the grader's module listing run on the image's own python3, which on
    SWE-bench's oldest specs (Ubuntu xenial) is 3.5: no f-strings or later syntax there. (`capture_output`
    and `ModuleInfo.name` are 3.7 / 3.6 APIs, absent from the source by the same token.)"""
    import ast

    from swerl.envs.swe.grading import _MODULE_NAMES
    from swerl.envs.swe.scrub import FIND_PY

    for source in (FIND_PY, _MODULE_NAMES):
        ast.parse(source, feature_version=(3, 5))
        assert "capture_output" not in source and ".name for m in pkgutil" not in source
