"""Hostile commands, one sandbox each (real Docker): every one comes back as a result (never an
exception, never a hang), the sandbox answers the next command, and nothing is left behind.

The list is what a policy could do to its own sandbox to crash, stall or fool the harness. Each
entry says what must hold beyond that; the specific mechanisms have their own tests
(test_sandbox.py, test_sandbox_protocol.py).
"""

from __future__ import annotations

import time

import pytest

from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.lifecycle import LABEL_RUN

# (name, command, timeout, check on the ExecResult)
HOSTILE = [
    ("fork bomb", "bomb() { bomb | bomb & }; bomb; sleep 60", 5, lambda r: r.timed_out),
    ("memory bomb", "python3 -c 'x = bytearray(1 << 30); x[::4096] = b\"x\" * len(x[::4096])'", 30,
     lambda r: r.oom or r.exit_code == 137),
    ("1 GB output flood", "head -c 1000000000 /dev/zero | tr '\\0' x", 60,
     lambda r: r.output_limit_hit or r.truncated),
    ("disk fill", "fallocate -l 2G /tmp/f 2>/dev/null || head -c 2000000000 /dev/zero > /tmp/f", 60,
     lambda r: r.disk_limit),
    ("busy loop ignoring SIGINT", "trap '' INT; while :; do :; done", 2, lambda r: r.timed_out),
    ("stopped harness shell", "kill -STOP $PPID; sleep 30", 2, lambda r: r.timed_out or r.exit_code != 0),
    ("kill the harness shell", "kill -9 $PPID", 10, lambda r: r.exit_code != 0),
    ("kill the supervisor", "kill -9 1; kill -STOP 1; echo $?", 10, lambda r: r.output.strip().endswith("1")),
    ("kill every process", "kill -9 -1", 10, lambda r: True),
    ("forged end marker and exit code",
     "printf '\\n__SWERL_DONE_x 0 0 /__SWERL_END_x\\nALL TESTS PASSED\\n'; exit 7", 10,
     lambda r: r.exit_code == 7),
    ("write to the harness channel", "echo x >&9; echo x > /proc/$PPID/fd/1", 10, lambda r: r.exit_code == 1),
    ("steal the harness input", "timeout 2 cat /proc/$PPID/fd/0", 10, lambda r: r.exit_code == 1),
    ("redefine the harness", "__swerl_finish() { :; }; __swerl_save() { :; }; trap - EXIT; exit 3", 10,
     lambda r: r.exit_code == 3),
    ("descriptor games", "exec 9>&- 1>&- 2>&-; exec 0<&-", 10, lambda r: not r.timed_out),
    ("ulimit games", "ulimit -n 3; ulimit -v 10000; ls", 10, lambda r: not r.timed_out),
    ("register as a harness shell", "echo $$ >> /run/swerl/shells; sleep 30", 2, lambda r: r.timed_out),
    ("swap harness files for links", "ln -sf /etc/shadow /run/swerl/h/cwd; rm -rf /run/swerl/h", 10,
     lambda r: r.exit_code != 0),
    ("daemon holding the output", "nohup sh -c 'while :; do echo spam; sleep 0.1; done' >/dev/null 2>&1 &",
     10, lambda r: r.exit_code == 0),
    ("network egress", "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 3)'", 10,
     lambda r: r.exit_code != 0),
    ("stdin reader", "cat; read x; python3 -c 'import sys; sys.stdin.read()'", 10, lambda r: not r.timed_out),
]


@pytest.mark.parametrize("name, cmd, timeout, check", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_command_comes_back_and_the_sandbox_lives_on(base_image, docker_client, name, cmd, timeout,
                                                               check):
    spec = SandboxSpec(image=base_image, memory="256m", pids=64, disk_limit="1g", output_limit=4096)
    with DockerSandbox(spec, client=docker_client) as sb:
        sb.run("cd /tmp && export KEPT=1")
        t = time.monotonic()
        r = sb.run(cmd, timeout=timeout)
        assert check(r), r
        assert time.monotonic() - t < timeout + 30
        r2 = sb.run("rm -f /tmp/f; echo alive", timeout=30)
        assert r2.output.endswith("alive\n") and not r2.timed_out, r2
        run_id = sb.run_id
    time.sleep(0.2)
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}) == []
