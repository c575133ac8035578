"""A cluster on one machine, shared by the module that asks for it (`swerl.cluster.onebox`): a second Docker
daemon beside the first, and a Ray cluster of a head and two nodes, node `a` offering sandbox host `a` (this
machine's daemon) and node `b` host `b` (the second daemon). Health checks are tuned so a removed node is
seen within seconds."""

from __future__ import annotations

import docker
import pytest
from fleet_helpers import DAEMON2_NAME

from swerl.cluster.onebox import extra_daemon, onebox_cluster


@pytest.fixture(scope="module")
def daemon2(base_image, docker_client):
    """A second Docker daemon holding swerl's base image; stopped (nothing left on it) afterwards."""
    with extra_daemon(DAEMON2_NAME, images=[base_image], source=docker_client) as url:
        client = docker.DockerClient(base_url=url, timeout=120)
        yield client
        client.close()


@pytest.fixture(scope="module")
def cluster(daemon2):
    """A Ray head and nodes `a` and `b` (tests remove and add nodes by host name)."""
    with onebox_cluster(["a", "b"]) as box:
        yield box
