"""Shared fixtures. Sandbox tests run against the real Docker engine (scripts/setup.sh starts it)."""

from __future__ import annotations

import os
import uuid

import pytest

# Every container the suite creates carries this run id, so the last check can prove none is left.
TEST_RUN_ID = f"pytest-{uuid.uuid4().hex[:8]}"
os.environ["SWERL_RUN_ID"] = TEST_RUN_ID

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def docker_client():
    from swerl.sandbox import lifecycle

    # No skip: the suite is meant to run against a real engine, and CI starts one.
    return lifecycle.docker_client()


@pytest.fixture(scope="session")
def base_image(docker_client):
    from swerl.sandbox.images import build_base_image

    return build_base_image(client=docker_client, log=None)


@pytest.fixture(scope="session")
def demo_wheels(tmp_path_factory):
    from pathlib import Path

    from swerl.sandbox.images import download_wheels

    return download_wheels(["pytest==9.2.0"], Path(ROOT) / ".cache" / "wheels" / "demo")


@pytest.fixture(scope="session")
def demo_recipe(base_image, demo_wheels):
    from pathlib import Path

    from swerl.sandbox.images import TaskImageRecipe

    return TaskImageRecipe(name="demo-calculator", repo_dir=Path(ROOT) / "tasks" / "demo" / "calculator",
                           wheels_dir=demo_wheels, requirements=("pytest",))


@pytest.fixture(scope="session")
def task_image(docker_client, demo_recipe):
    from swerl.sandbox.images import build_task_image

    return build_task_image(demo_recipe, client=docker_client)


@pytest.fixture(scope="session")
def tok():
    """The real Qwen tokenizer (bundled)."""
    from swerl.agent import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def sandbox(base_image):
    from swerl.sandbox import DockerSandbox, SandboxSpec

    with DockerSandbox(SandboxSpec(image=base_image, memory="512m", output_limit=4096)) as sb:
        yield sb


def _leftovers():
    import docker

    client = docker.from_env()
    return client.containers.list(all=True, filters={"label": f"swerl.run={TEST_RUN_ID}"})


_FIRST_SEEN: dict[str, str] = {}
"""container id -> the test module after which it was first seen still there."""


@pytest.fixture(scope="module", autouse=True)
def _note_leftovers(request):
    """Only notes (a module's background removals may still be under way): the session check fails."""
    yield
    try:
        for c in _leftovers():
            _FIRST_SEEN.setdefault(c.id, request.node.nodeid)
    except Exception:  # the daemon is away: the session check says so
        pass


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind():
    yield
    left = _leftovers()
    named = [f"{c.name} (image {c.attrs['Config']['Image']}, task {c.labels.get('swerl.task', '-')}, "
             f"first seen after {_FIRST_SEEN.get(c.id, 'the last module')})" for c in left]
    for c in left:
        c.remove(force=True)
    assert not left, f"the suite left {len(left)} container(s) behind: {named}"
