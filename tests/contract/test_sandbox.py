"""The Sandbox contract (swerl/sandbox/base.py) over every backend of `SANDBOX_BACKENDS`
(tests/contract/conftest.py): commands give values (exit code, combined output, duration, timeout,
capped output with a marker) and never exceptions; the shell's state persists; files written are the
bytes read back, by the command's user; `upload`, `diff`; `close` is idempotent and removes what the
sandbox started. tests/test_sandbox*.py go deeper into DockerSandbox's own mechanics.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from swerl.sandbox import Sandbox, SandboxError
from swerl.structs import ExecResult

pytestmark = pytest.mark.docker


def test_it_is_a_sandbox_and_start_is_idempotent(sandbox_backend):
    box = sandbox_backend.make()
    assert isinstance(box, Sandbox)
    with box as sb:
        assert sb is box and sb.start() is sb and sandbox_backend.alive(sb)
        assert sb.run("whoami").output == f"{sandbox_backend.user}\n"


@pytest.mark.parametrize("cmd, code", [
    ("true", 0),
    ("false", 1),
    ("exit 3", 3),
    ("(exit 255)", 255),
    ("no-such-command-here", 127),
    ("bash -c 'kill -KILL $$'", 128 + 9),  # killed by a signal: 128 + its number
    ("bash -c 'kill -TERM $$'", 128 + 15),
])
def test_exit_codes_are_values(sb, cmd, code):
    r = sb.run(cmd)
    assert isinstance(r, ExecResult) and r.exit_code == code and not r.timed_out and not r.oom
    assert r.ok == (code == 0)
    assert sb.run("echo still here").output == "still here\n"  # the shell survives each of them


def test_output_is_stdout_and_stderr_in_order_decoded_as_utf8(sb):
    r = sb.run("echo out; echo err >&2; printf 'caf\\xc3\\xa9 \\xff end'")
    assert r.output == "out\nerr\ncafé \ufffd end"
    assert r.output_bytes == len(b"out\nerr\ncaf\xc3\xa9 \xff end") and not r.truncated


def test_the_shell_keeps_its_directory_environment_and_functions(sb):
    assert sb.run("cd /tmp && export SWERL_X=41 && f() { echo $((SWERL_X + $1)); }").exit_code == 0
    assert sb.run("pwd; f 1").output == "/tmp\n42\n"


def test_a_timeout_is_a_result_and_the_shell_lives_on(sb):
    t0 = time.monotonic()
    r = sb.run("sleep 30; echo never", timeout=2)
    took = time.monotonic() - t0
    assert r.timed_out and not r.ok and r.exit_code == 130 and "never" not in r.output  # interrupted (SIGINT)
    assert 2 <= r.duration_s <= took < 20
    assert sb.run("echo alive").output == "alive\n"


def test_duration_is_the_commands_wall_clock(sb):
    r = sb.run("sleep 1")
    assert r.ok and 1.0 <= r.duration_s < 10


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_a_timeout_that_is_not_a_positive_finite_number_is_a_value_error(sb, timeout):
    with pytest.raises(ValueError, match="timeout"):
        sb.run("true", timeout=timeout)


def test_output_past_the_limit_is_cut_in_the_middle_with_a_marker(sb):
    r = sb.run("head -c 3000 /dev/zero | tr '\\0' a; head -c 97000 /dev/zero | tr '\\0' b")
    assert r.ok and r.output_bytes == 100_000 and r.truncated
    head, _, rest = r.output.partition("\n\n[... ")
    assert head == "a" * 2048  # the first half of the 4096-byte limit
    marker, _, tail = rest.partition(" ...]\n\n")
    assert marker.startswith(f"{100_000 - 4096} bytes of output cut") and tail == "b" * 2048


def test_written_bytes_are_read_back_and_seen_by_commands(sb):
    data = bytes(range(256)) * 4
    sb.write_file("/tmp/deep/er/blob.bin", data, mode=0o750)
    assert sb.read_file("/tmp/deep/er/blob.bin") == data
    r = sb.run("sha256sum /tmp/deep/er/blob.bin; stat -c '%a %U' /tmp/deep/er/blob.bin")
    assert r.output.split("\n")[:2] == [f"{hashlib.sha256(data).hexdigest()}  /tmp/deep/er/blob.bin",
                                         f"750 {sb.run('whoami').output.strip()}"]
    sb.write_file("/tmp/deep/er/blob.bin", "é\n")  # replaced, str as UTF-8
    assert sb.read_file("/tmp/deep/er/blob.bin") == "é\n".encode()
    assert sb.read_text("/tmp/deep/er/blob.bin") == "é\n"
    sb.run("printf 'made by a command' > /tmp/cmd.txt")
    assert sb.read_file("/tmp/cmd.txt") == b"made by a command"


def test_file_errors_are_the_usual_exceptions(sb):
    with pytest.raises(FileNotFoundError, match="/tmp/absent"):
        sb.read_file("/tmp/absent")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/tmp")
    sb.write_file("/tmp/big.txt", "x" * 100)
    with pytest.raises(ValueError, match="100 bytes"):
        sb.read_file("/tmp/big.txt", max_bytes=99)
    assert sb.read_file("/tmp/big.txt", max_bytes=100) == b"x" * 100


def test_upload_copies_a_host_tree_under_dest(sb, tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "sub" / "b.bin").write_bytes(b"\x00\x01")
    sb.upload(tmp_path / "pkg", "/tmp/up")
    assert sb.read_file("/tmp/up/pkg/a.py") == b"A = 1\n"
    assert sb.read_file("/tmp/up/pkg/sub/b.bin") == b"\x00\x01"
    with pytest.raises(FileNotFoundError):
        sb.upload(tmp_path / "nope", "/tmp/up")


def test_diff_is_the_working_tree_against_the_start(sandbox_backend, sb):
    if not sandbox_backend.git:
        with pytest.raises(SandboxError, match="not a git repository"):
            sb.diff()
        return
    assert sb.diff() == ""
    tracked = sb.run("cd /testbed && git ls-files | grep '\\.py$' | head -1").output.strip()
    assert tracked
    sb.run(f"cd /testbed && echo '# changed' >> {tracked} && printf 'new\\n' > brand_new.txt")
    d = sb.diff()
    assert f"diff --git a/{tracked} b/{tracked}" in d and "+# changed" in d
    assert "diff --git a/brand_new.txt b/brand_new.txt" in d and "new file mode" in d and "+new" in d
    # from HEAD, not the index: diff() stages the tree (`git add -A`) to include new files
    sb.run(f"cd /testbed && git checkout -q HEAD -- {tracked} && rm brand_new.txt")
    assert sb.diff() == ""


def test_close_is_idempotent_and_removes_what_it_started(sandbox_backend):
    box = sandbox_backend.make().start()
    assert sandbox_backend.alive(box)
    box.close()
    box.close()
    assert not sandbox_backend.alive(box)
    with pytest.raises(SandboxError, match="not started"):
        box.run("true")


def test_leaving_the_with_block_by_an_exception_closes_it(sandbox_backend):
    with pytest.raises(KeyError), sandbox_backend.make() as box:
        raise KeyError("boom")
    assert not sandbox_backend.alive(box)
