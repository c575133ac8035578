"""The `swerl` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def swerl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "swerl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=300)


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
