"""Servers swerl launches are stopped with everything they started: on close, and when the process that
owns them gets SIGTERM (its cleanup runs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

SERVER = textwrap.dedent("""
    import http.server, signal, subprocess, sys
    # children like vLLM's EngineCore / workers: one stops on SIGTERM, one ignores it
    kids = [subprocess.Popen(["sleep", "300"]),
            subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(300)"])]
    open(sys.argv[2], "w").write(" ".join(str(k.pid) for k in kids))

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

OWNER = textwrap.dedent("""
    import asyncio, sys, time
    from swerl.rollout.server import ServerEngine
    from swerl.sandbox import lifecycle
    from swerl.rollout.config import ServerConfig

    lifecycle.install_handlers()  # as swerl train does
    ServerEngine.close_wait_s = 2.0
    port, pids, server = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = ServerConfig(model_path="unused", port=int(port), startup_timeout_s=60)
    eng = asyncio.run(ServerEngine._start(cfg, [sys.executable, "-c", server, port, pids],
                                          log_dir=sys.argv[4]))
    try:  # entered before "ready": a SIGTERM right after it must find the cleanup in place
        print("ready", eng.process.pid, flush=True)
        time.sleep(120)
    finally:
        asyncio.run(eng.close())
        print("closed", flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has stopped; only its parent's wait is due
    except FileNotFoundError:
        return False


def _start_owner(tmp_path):
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(_free_port()), str(pids), SERVER,
                             str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", line
    for _ in range(100):
        if pids.exists() and pids.read_text():
            break
        time.sleep(0.05)
    group = [int(line[1]), *map(int, pids.read_text().split())]
    assert all(_alive(p) for p in group)
    return proc, group


def test_sigterm_to_the_owner_stops_the_server_and_its_children(tmp_path):
    proc, group = _start_owner(tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "closed" in out  # the owner's cleanup ran
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in group if _alive(p)], "server processes left behind"


def test_close_stops_a_child_that_ignores_sigterm(tmp_path):
    import asyncio

    from swerl.rollout.config import ServerConfig
    from swerl.rollout.server import ServerEngine

    pids = tmp_path / "pids"
    port = _free_port()
    cfg = ServerConfig(model_path="unused", port=port, startup_timeout_s=60)
    eng = asyncio.run(ServerEngine._start(cfg, [sys.executable, "-c", SERVER, str(port), str(pids)],
                                          log_dir=tmp_path))
    try:
        for _ in range(100):
            if pids.exists() and pids.read_text():
                break
            time.sleep(0.05)
        kids = list(map(int, pids.read_text().split()))
        leader = eng.process.pid
        assert os.getpgid(kids[1]) == leader  # the server's session: what close() signals
    finally:
        eng.close_wait_s = 1.0
        t0 = time.monotonic()
        asyncio.run(eng.close())
    assert not [p for p in (leader, *kids) if _alive(p)]
    assert time.monotonic() - t0 < 15
