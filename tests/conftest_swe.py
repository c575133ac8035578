"""Fixtures for the SWE task tests (imported by tests/test_swe_*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tasks" / "swe" / "instances.jsonl"

@pytest.fixture(scope="session")
def swe_suite():
    from swerl.envs.swe.instances import load_instances

    return load_instances(SUITE)

def pick(suite, library: str, *, p2p_contains: str = "", f2p_lacks: str = ""):
    """The first shipped instance of `library` whose PASS_TO_PASS has a test matching `p2p_contains`
    and whose FAIL_TO_PASS has none matching `f2p_lacks`."""
    for inst in suite:
        if not inst.instance_id.startswith(f"{library}__"):
            continue
        if p2p_contains and not any(p2p_contains in t for t in inst.pass_to_pass):
            continue
        if f2p_lacks and any(f2p_lacks in t for t in inst.fail_to_pass):
            continue
        return inst
    raise AssertionError(f"no shipped {library} instance fits (p2p {p2p_contains!r}, f2p without {f2p_lacks!r})")

@pytest.fixture(scope="session")
def swe_log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("swe-logs")

