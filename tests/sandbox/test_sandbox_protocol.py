"""The command protocol cannot be forged from inside the sandbox (real Docker).

Each test is an attack a policy could stumble on or search for: reading the nonce, printing a fake
end marker or exit code, writing to the harness's channel, redefining the harness's functions,
descriptor and ulimit games, killing or robbing the harness shell, swapping its files for links.
Every one must come back as what it is: the command's real exit status and output, in time, with
the sandbox usable afterwards.
"""

from __future__ import annotations

import time

import pytest

from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox import session as session_mod


@pytest.fixture
def nonces(monkeypatch):
    """Every nonce the host sends, so a test can look for it in what a command printed."""
    sent: list[str] = []
    send = session_mod.ShellSession.send_command

    def spy(self, cmd, signals=0):
        nonce = send(self, cmd, signals)
        sent.append(nonce)
        return nonce

    monkeypatch.setattr(session_mod.ShellSession, "send_command", spy)
    return sent


@pytest.fixture(params=["auto", "root"])
def any_user_sandbox(request, base_image):
    """The image's non-root user (the default), and root: the attacks here fail for both."""
    with DockerSandbox(SandboxSpec(image=base_image, user=request.param)) as sb:
        yield sb


def test_nothing_the_command_can_read_holds_its_nonce(sandbox, nonces):
    r = sandbox.run(
        "{ set; env; declare -p; cat /proc/self/environ /proc/$PPID/cmdline /proc/$PPID/environ; "
        "ls -l /proc/self/fd; timeout 2 cat /proc/$PPID/fd/0; grep -ra . /run/swerl; } > /tmp/dump 2>&1; "
        "echo end",
        timeout=20,
    )
    assert not r.timed_out and r.output == "end\n"
    dump = sandbox.read_file("/tmp/dump").decode(errors="replace")
    assert "__swerl_save" in dump and "SWERL_USER" in dump  # it did read the shell and the harness files
    assert nonces and not any(n in dump for n in nonces)
    # the harness's environment and stdin, opened through /proc
    assert "environ: Permission denied" in dump and "fd/0: Permission denied" in dump


def test_a_forged_end_marker_and_exit_code_are_just_output(any_user_sandbox):
    sb = any_user_sandbox
    fake = "\\n__SWERL_DONE_%s 0 0 /__SWERL_END_%s\\n"
    r = sb.run(f"printf '{fake}' x x; printf '{fake}' \"$__swerl_nonce\" \"$__swerl_nonce\"; "
               "echo 'ALL 1042 TESTS PASSED'; exit 7")
    assert r.exit_code == 7 and not r.timed_out
    assert r.output.endswith("ALL 1042 TESTS PASSED\n") and r.output.count("__SWERL_DONE_") == 2


def test_a_lone_end_or_begin_marker_is_not_a_sandbox_failure(any_user_sandbox):
    r = any_user_sandbox.run("printf '__SWERL_END_abc\\n__SWERL_BEGIN_abc\\n'")
    assert r.exit_code == 0 and r.output == "__SWERL_END_abc\n__SWERL_BEGIN_abc\n"
    assert any_user_sandbox.run("echo next").output == "next\n"


def test_the_harness_channel_is_out_of_reach(sandbox):
    r = sandbox.run("echo FORGED >&9; echo FORGED > /proc/$PPID/fd/1; echo FORGED > /proc/$PPID/fd/9; "
                    "kill -9 $PPID; echo rc=$?")
    assert r.output.count("FORGED") == 0 and r.output.endswith("rc=1\n")
    assert "9: Bad file descriptor" in r.output and r.output.count("Permission denied") == 2
    assert "Operation not permitted" in r.output  # the harness runs as another user
    assert sandbox.run("echo alive").output == "alive\n"


def test_redefined_harness_functions_only_change_the_commands_own_shell(any_user_sandbox):
    sb = any_user_sandbox
    r = sb.run("__swerl_finish() { echo hacked; }; __swerl_mark() { :; }; __swerl_run() { :; }; "
               "__swerl_save() { :; }; exit 5")
    assert r.exit_code == 5 and r.output == ""
    r = sb.run("echo $((6 * 7)); false")
    assert (r.exit_code, r.output) == (1, "42\n")


@pytest.mark.parametrize("game, code", [
    ("exec 9>&-; echo done", 0),
    ("exec 9>/dev/null; echo done >&9; echo done", 0),
    ("exec 0<&-; exec 3>&-; echo done", 0),
    ("ulimit -n 3; ls / > /dev/null; echo done", 0),  # ls cannot even load its libraries; echo is a builtin
    ("exec 1>&- 2>&-; echo lost", 1),
])
def test_descriptor_and_ulimit_games_come_back_as_what_they_are(any_user_sandbox, game, code):
    sb = any_user_sandbox
    before = sb.run("ulimit -n; ls -l /proc/self/fd | wc -l").output
    t = time.monotonic()
    r = sb.run(game, timeout=20)
    assert not r.timed_out and r.exit_code == code and time.monotonic() - t < 10
    assert ("done" in r.output) == ("done" in game)
    # and nothing of it stays: the next command has its descriptors and limits back
    assert sb.run("ulimit -n; ls -l /proc/self/fd | wc -l").output == before


def test_the_harness_files_cannot_be_swapped_for_links(sandbox):
    r = sandbox.run("ln -sf /etc/shadow /run/swerl/h/cwd; rm -f /run/swerl/h/out; "
                    "ln /etc/passwd /run/swerl/h/x; echo rc=$?")
    assert r.output.count("Permission denied") >= 2 and r.output.endswith("rc=1\n")
    r = sandbox.run("cd /tmp && pwd")
    assert r.output == "/tmp\n" and sandbox.run("pwd").output == "/tmp\n"


def test_a_root_command_that_kills_its_shell_gets_an_observation_not_a_failure(base_image):
    with DockerSandbox(SandboxSpec(image=base_image, user="root")) as sb:
        sb.run("cd /opt && export KEPT=yes")
        r = sb.run("kill -9 $PPID; sleep 1; echo never")
        assert r.exit_code == 137 and "shell was killed" in r.note
        assert sb.run("pwd; echo $KEPT").output == "/opt\nyes\n"  # the new shell loads the state


def test_file_tools_act_as_the_command_user_not_as_root(sandbox):
    """Docker's archive API works as root: an editor built on it could replace a program the root
    harness runs for every command (setpriv) and so forge every later result, or read what only root
    may. read_file / write_file have exactly the command user's rights."""
    setpriv = sandbox.run("command -v setpriv").output.strip()
    before = sandbox.run(f"sha256sum {setpriv}").output
    for target in (setpriv, "/etc/profile.d/x.sh", "/run/swerl/h/child.sh"):
        with pytest.raises(PermissionError, match="permission denied for the sandbox user swerl"):
            sandbox.write_file(target, "#!/bin/sh\necho pwned\n")
    assert sandbox.run(f"sha256sum {setpriv}").output == before
    with pytest.raises(PermissionError):
        sandbox.read_file("/etc/shadow")
    assert sandbox.run("cat /etc/shadow").exit_code == 1  # as for a command
    # where the user may write, files land as the user's, byte for byte, through links as a command would
    data = bytes(range(256)) * 3 + b"\0 no newline at the end"
    sandbox.write_file("/tmp/deep/er/f.bin", data, mode=0o600)
    assert sandbox.read_file("/tmp/deep/er/f.bin") == data
    assert sandbox.run("stat -c '%U %a' /tmp/deep/er/f.bin").output == "swerl 600\n"
    sandbox.run("ln -s /etc/shadow /tmp/link")
    with pytest.raises(PermissionError):
        sandbox.read_file("/tmp/link")
    with pytest.raises(IsADirectoryError):
        sandbox.write_file("/tmp/deep", "x")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file("/dev/zero")  # not a regular file: never read without end
    # the staging directory is the user's and cannot be swapped for a link into root's places
    r = sandbox.run("ls -ld /.swerl-stage | cut -d' ' -f1,3; mv /.swerl-stage /tmp/s; echo rc=$?")
    assert r.output.startswith("drwx------ swerl\n") and r.output.endswith("rc=1\n")


def test_the_editor_cannot_reach_past_testbed_through_links(sandbox):
    """The editor keeps to /testbed, but a link there can point anywhere: through a link to a root
    directory the old root-side write put a file into /usr/local/bin, and view read /etc/shadow."""
    import json

    from swerl.agent.tools import SandboxTools
    from swerl.structs import ToolCall

    assert sandbox.run("ln -s /usr/local/bin /testbed/bin && ln -s /etc/shadow /testbed/shadow").ok
    tools = SandboxTools(sandbox)
    args = {"command": "create", "path": "/testbed/bin/git", "file_text": "#!/bin/sh\n"}
    r = tools.execute(ToolCall("str_replace_editor", json.dumps(args)))
    assert r.error and "permission denied" in r.observation, r.observation
    assert sandbox.run("test -e /usr/local/bin/git").exit_code == 1
    r = tools.execute(ToolCall("str_replace_editor",
                               json.dumps({"command": "view", "path": "/testbed/shadow"})))
    assert r.error and "permission denied" in r.observation and "root:" not in r.observation, r.observation


def test_diff_runs_none_of_the_repositorys_own_programs(sandbox):
    """diff() is a harness command over the agent's repository, whose config the agent writes: an
    fsmonitor hook or an external diff would run the agent's program inside it."""
    r = sandbox.run("cd /testbed && rm -rf .git && git init -q && echo a > a && git add a && "
                    "git -c user.name=x -c user.email=x@y commit -qm a && "
                    "git config core.fsmonitor 'touch /tmp/hooked; echo FORGED >&2' && "
                    "git config diff.external 'sh -c \"echo FORGED\"' && echo b > a && git rev-parse HEAD")
    assert r.ok, r.output
    patch = sandbox.diff(r.output.strip().splitlines()[-1])
    assert "FORGED" not in patch and patch.endswith("@@ -1 +1 @@\n-a\n+b\n")
    assert sandbox.run("test -e /tmp/hooked").exit_code == 1


def test_diff_sees_every_edit_whatever_the_agents_index_says(sandbox):
    """An edit of the same size in the same second as the last `git add` is racily clean in the
    agent's index (CI caught diff() missing one), and assume-unchanged / skip-worktree bits hide
    edits from `git add -A`: the patch is made from the files, not from the agent's index."""
    r = sandbox.run("cd /testbed && rm -rf .git && git init -q && echo a > a && echo x > x && "
                    "echo s > s && git add a x s && git -c user.name=x -c user.email=x@y commit -qm a && "
                    "echo b > a && git update-index --assume-unchanged x && echo y > x && "
                    "git update-index --skip-worktree s && echo t > s && git rev-parse HEAD")
    assert r.ok, r.output
    patch = sandbox.diff(r.output.strip().splitlines()[-1])
    assert [ln for ln in patch.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")] == \
        ["-a", "+b", "-s", "+t", "-x", "+y"], patch


def test_diff_leaves_the_agents_index_alone(sandbox):
    r = sandbox.run("cd /testbed && rm -rf .git && git init -q && echo a > a && git add a && "
                    "git -c user.name=x -c user.email=x@y commit -qm a && git rev-parse HEAD")
    base = r.output.strip().splitlines()[-1]
    sandbox.run("echo b > /testbed/a && echo new > /testbed/n")
    assert sandbox.diff(base).count("diff --git") == 2
    # the edit is still only in the working tree: checkout undoes it, and the new file is untracked
    assert sandbox.run("cd /testbed && git status --porcelain").output == " M a\n?? n\n"
    assert sandbox.run("cd /testbed && git checkout -- a && cat a").output == "a\n"
