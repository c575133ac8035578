"""The `swerl` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def swerl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "swerl.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)


def test_help_lists_sandbox_commands():
    r = swerl("sandbox", "--help")
    assert r.returncode == 0
    for cmd in ("build-base", "reap", "ls", "demo"):
        assert cmd in r.stdout


@pytest.mark.docker
def test_build_base_is_cached(base_image):
    r = swerl("sandbox", "build-base")
    assert r.returncode == 0 and "up to date" in r.stdout


@pytest.mark.docker
def test_reap_reports_what_it_removed(base_image):
    r = swerl("sandbox", "reap", "--run-id", "no-such-run")
    assert r.returncode == 0 and "0 container(s) removed" in r.stdout


def test_daemon_unreachable_is_a_clear_error_not_a_traceback():
    r = swerl("sandbox", "ls", env={"DOCKER_HOST": "unix:///tmp/no-docker-here.sock"})
    assert r.returncode == 2
    assert "cannot reach the Docker daemon" in r.stderr and "Traceback" not in r.stderr


def test_python_dash_m_swerl_and_bare_swerl_print_help():
    for cmd in ([sys.executable, "-m", "swerl"], [sys.executable, "-m", "swerl", "--help"]):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: swerl") and all(c in r.stdout
                                                          for c in ("train", "eval", "tasks", "plot"))


def test_every_help_shows_the_defaults():
    r = swerl("eval", "model", "--help")
    assert r.returncode == 0
    flat = " ".join(r.stdout.split())  # argparse wraps lines
    assert "(default: 1800.0)" in flat and "(default: tasks/swe/instances.jsonl)" in flat
    assert "(default: 600.0)" in flat  # --engine-startup-timeout
    r = swerl("eval", "--help")
    assert r.returncode == 0 and all(m in r.stdout for m in ("predictions", "model", "game"))
    r = swerl("tasks", "validate", "--help")
    assert "(default: 2)" in " ".join(r.stdout.split())


def test_an_unknown_split_is_an_error_listing_the_splits():
    r = swerl("tasks", "list", "--split", "heldot")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("swerl: error: tasks/swe/instances.jsonl: no split 'heldot' — the splits "
                                "present are heldout, train")


def test_tasks_list_json():
    import json

    from swerl.envs.swe.instances import load_instances

    r = swerl("tasks", "list", "--split", "train", "--filter", "toolz__*", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    want = load_instances(os.path.join(ROOT, "tasks/swe"), split="train", filters=["toolz__*"])
    assert len(rows) == len(want) >= 4
    for row, inst in zip(rows, want, strict=True):
        assert row == {"instance_id": inst.instance_id, "split": "train", "repo": inst.repo,
                       "version": inst.version, "FAIL_TO_PASS": list(inst.fail_to_pass),
                       "PASS_TO_PASS": list(inst.pass_to_pass)}


@pytest.mark.parametrize(("args", "says"), [
    (["train", "--config", "configs/nope.yaml"], "config file configs/nope.yaml does not exist — see "
                                                 "`swerl train --help-config`"),
    (["train", "--config", "configs/toy_cpu.yaml", "optim.lr=fast"],
     "optim.lr: expected a number, got 'fast'"),
    (["train", "--config", "configs/toy_cpu.yaml", "steps=0"], "steps must be >= 1"),
    (["tasks", "list", "--tasks", "/nowhere/instances.jsonl"], "swerl: error: "),
    (["plot", "/nowhere/run"], "swerl: error: "),
])
def test_expected_errors_are_one_line_without_a_traceback(args, says, capsys, monkeypatch):
    from swerl.cli import main

    monkeypatch.chdir(ROOT)  # in process (a process each costs seconds); one runs as a process below
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swerl: error: ") and says in lines[0], err
    assert "Traceback" not in err
    assert main(["--debug", *args]) == 2
    debug = capsys.readouterr().err
    assert "Traceback" in debug and debug.strip().endswith(lines[0])


def test_an_expected_error_in_a_process_of_its_own_is_one_line():
    r = swerl("train", "--config", "configs/toy_cpu.yaml", "steps=0")
    assert r.returncode == 2 and r.stderr == ("swerl: error: TrainConfig: steps must be >= 1, got 0 — see "
                                              "`swerl train --help-config` for every key\n"), r.stderr
    debug = swerl("--debug", "train", "--config", "configs/toy_cpu.yaml", "steps=0")
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_attaching_to_a_url_where_nothing_listens_fails_within_seconds(tmp_path):
    import time

    from swerl.models import make_tiny_qwen

    model = make_tiny_qwen(tmp_path / "m", hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1,
                           intermediate_size=64, seed=0)
    t0 = time.monotonic()
    r = swerl("eval", "--model", str(model), "--engine", "vllm", "--engine-url", "http://127.0.0.1:9",
              "--limit", "1", "--out", str(tmp_path / "out"))
    took = time.monotonic() - t0
    assert r.returncode == 2 and took < 60, (took, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("swerl: waiting for the vllm server at http://127.0.0.1:9")
    assert lines[-1] == ("swerl: error: nothing listens at http://127.0.0.1:9 (connection refused for 3 s) "
                         "— start the vLLM server there, or fix the URL")


def test_a_server_that_never_gets_healthy_is_waited_for_as_long_as_the_flag_says(tmp_path):
    """A server that accepts connections but answers /health 503 (as a starting server does) is waited
    for, with waiting lines, until --engine-startup-timeout; then one error line."""
    import http.server
    import threading
    import time

    from swerl.models import make_tiny_qwen
    from swerl.rollout.server import ServerEngine

    class Starting(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Starting)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    model = make_tiny_qwen(tmp_path / "m", hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1,
                           intermediate_size=64, seed=0)
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-c", "import sys; from swerl.rollout.server import ServerEngine; "
             "ServerEngine.wait_note_s = 1.0; from swerl.cli import main; sys.exit(main(sys.argv[1:]))",
             "eval", "--model", str(model), "--engine", "vllm", "--engine-url", url, "--limit", "1",
             "--engine-startup-timeout", "4", "--out", str(tmp_path / "out")],
            capture_output=True, text=True, cwd=ROOT, timeout=120)
        took = time.monotonic() - t0
    finally:
        srv.shutdown()
    assert ServerEngine.wait_note_s == 15.0  # the subprocess lowered its own copy only
    assert r.returncode == 2 and 4 <= took < 60, (took, r.stderr)
    lines = r.stderr.strip().splitlines()
    waits = [line for line in lines if "to become healthy" in line]
    assert len(waits) >= 2 and waits[0].startswith(f"swerl: waiting for the vLLM server at {url} to become "
                                                   "healthy")
    assert lines[-1].startswith(f"swerl: error: vLLM server {url} not healthy after 4 s — raise the start-up "
                                "timeout")


def test_train_against_a_dead_server_is_one_line_and_leaves_no_metrics(tmp_path):
    r = swerl("train", "--config", "configs/debug_cpu.yaml", f"run_dir={tmp_path}", "rollout.engine=vllm",
              "rollout.vllm.urls=[http://127.0.0.1:9]")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("swerl: error: nothing listens at http://127.0.0.1:9 "
                                                 "(connection refused for 3 s) — start the vLLM server "
                                                 "there, or fix the URL")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_eval_modes_and_the_old_flag_forms():
    """`swerl eval predictions | model | game`; the command lines of before the subcommands parse as the
    subcommand they meant, and a contradictory one is one error line naming the new forms."""
    import contextlib
    import io

    from swerl.cli import build_parser

    parse = build_parser().parse_args
    new = parse(["eval", "predictions", "p.jsonl", "--workers", "4"])
    old = parse(["eval", "--tasks", "t.jsonl", "--predictions", "p.jsonl", "--workers", "4"])
    assert new.mode == old.mode == "predictions" and new.predictions == old.predictions == "p.jsonl"
    assert parse(["eval", "--predictions=p.jsonl"]).predictions == "p.jsonl"
    assert parse(["--debug", "eval", "--model", "m", "--k", "2"]).mode == "model"
    assert parse(["eval", "model", "--model", "m"]).model == "m"
    g = parse(["eval", "--limit", "3", "--game", "webshop", "--expert"])
    assert (g.mode, g.game, g.limit, g.expert) == ("game", "webshop", 3, True)
    for argv in (["eval", "--model", "m", "--predictions", "p.jsonl"], ["eval", "model"], ["eval"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
            parse(argv)
        assert e.value.code == 2
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        parse(["eval", "--model", "m", "--predictions", "p.jsonl"])
    assert err.getvalue().count("\n") == 1 and "swerl eval predictions FILE" in err.getvalue()
