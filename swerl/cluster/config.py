"""The `cluster` config section: one machine (the default, no Ray) or a Ray cluster of sandbox hosts.

Imports nothing but the standard library, so configs load (and `--help` prints) without Ray installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HOST_RESOURCE_PREFIX = "swerl_host_"
"""A Ray node offers a sandbox host by a custom resource named `swerl_host_<name>` (`ray start
--resources='{"swerl_host_a": 1}'`): the host's actor is pinned to it, so it restarts where that
resource comes back (the same node rejoining, or a replacement started with the same resource)."""

GENERATIONS = ("auto", "direct", "bridge")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class HostConfig:
    """One sandbox host named in the config (hosts found on the cluster need no entry; one lets you give a
    host a remote daemon or a fixed capacity)."""

    name: str = ""
    """The host's name: the node offering resource `swerl_host_<name>` runs its actor."""
    docker_url: str = ""
    """The host's Docker daemon (`unix:///var/run/docker.sock`, `tcp://10.0.0.5:2376`, ...); empty: the
    node's own daemon (DOCKER_HOST there, else the default socket)."""
    capacity: int = 0
    """Sandboxes the host runs at once; 0: from its cores and memory (one sandbox per core the sandbox spec
    asks for, and per its memory limit, whichever is fewer)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"cluster.hosts: name {self.name!r} must be 1-63 letters, digits, '_', '.' or "
                             "'-' (it becomes the Ray resource swerl_host_<name>)")
        if self.capacity < 0:
            raise ValueError(f"cluster.hosts[{self.name}].capacity must be >= 0 (0: automatic), "
                             f"got {self.capacity}")

    @property
    def resource(self) -> str:
        return HOST_RESOURCE_PREFIX + self.name


@dataclass(frozen=True)
class RayConfig:
    """How to reach the Ray cluster."""

    address: str = "auto"
    """`auto` (the cluster this node belongs to, from `ray start`), `host:port` of the head's GCS, or
    `local` (a one-node cluster started in this process, its one sandbox host `local` on this machine's
    daemon: for trying the path on one machine)."""
    namespace: str = "swerl"
    """Ray namespace of the run's actors (the hosts' reapers are named in it)."""


@dataclass(frozen=True)
class ClusterConfig:
    """Where episodes and their sandboxes run (config key `cluster`)."""

    backend: str = "local"
    """`local`: every episode and sandbox on this machine's Docker daemon (no Ray). `ray`: spread over the
    sandbox hosts of a Ray cluster (`pip install -e '.[ray]'`), each episode run on its sandbox's host."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The Ray cluster (backend `ray`)."""
    hosts: tuple[HostConfig, ...] = ()
    """Hosts to give a remote daemon or a fixed capacity; the others are found on the cluster by their
    `swerl_host_<name>` resource."""
    discover: bool = True
    """Also use the hosts found on the cluster (a node's `swerl_host_<name>` resource, also one that joins
    mid-run) besides those in `hosts`; false: only the hosts `hosts` names."""
    min_hosts: int = 1
    """Hosts that must be up before the first episode starts (waited for up to `start_timeout_s`)."""
    start_timeout_s: float = 120.0
    """Seconds to wait at start for `min_hosts` hosts to answer."""
    requeue: int = 2
    """Times an episode whose host was lost under it (actor, node or daemon gone) is started again on
    another host; the lost attempts are failed, never scored."""
    heartbeat_s: float = 1.0
    """Seconds between the dispatcher's pings of each host; a host that misses `heartbeat_misses` in a
    row, or whose daemon does not answer, is marked lost."""
    heartbeat_misses: int = 3
    """Pings a host may miss before it is marked lost."""
    sandbox_ttl_s: float = 7200.0
    """Seconds a sandbox container may live; a host's reaper removes older ones (labelled `swerl.expires`),
    and those whose owner process is gone, even after the driver was killed."""
    reap_interval_s: float = 5.0
    """Seconds between a host reaper's passes."""
    generation: str = "auto"
    """How the episodes on the hosts generate. `direct`: each host is a client of the inference servers
    the driver's engine uses (its workers in rotation, or its router), so a model turn, like a tool call,
    never crosses Ray. `bridge`: every model turn goes to the driver's engine over Ray (three Ray calls a
    turn). `auto`: direct with SGLang or vLLM servers the host reaches (servers on the driver's loopback:
    only from hosts on the driver's machine), else bridge (the in-process hf engine lives in the
    driver)."""

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise ValueError(f"cluster.backend must be 'local' or 'ray', got {self.backend!r}")
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"cluster.hosts names a host twice: {twice}")
        if self.min_hosts < 1:
            raise ValueError(f"cluster.min_hosts must be >= 1, got {self.min_hosts}")
        if self.requeue < 0:
            raise ValueError(f"cluster.requeue must be >= 0, got {self.requeue}")
        for key in ("start_timeout_s", "heartbeat_s", "sandbox_ttl_s", "reap_interval_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"cluster.{key} must be > 0, got {getattr(self, key)}")
        if self.generation not in GENERATIONS:
            raise ValueError(f"cluster.generation must be one of {GENERATIONS}, got {self.generation!r}")
        if self.heartbeat_misses < 1:
            raise ValueError(f"cluster.heartbeat_misses must be >= 1, got {self.heartbeat_misses}")

    @property
    def enabled(self) -> bool:
        return self.backend == "ray"

    def host(self, name: str) -> HostConfig:
        """The config of host `name` (its entry in `hosts`, else the defaults)."""
        for h in self.hosts:
            if h.name == name:
                return h
        return HostConfig(name=name)
