"""Scale-out on Ray: episodes and their sandboxes spread over many Docker hosts, with failover.

- `config`: the `cluster` section (`backend: local` — one machine, no Ray — or `ray`).
- `schedule`: the dispatcher's bookkeeping (free slots, image locality, turns), free of Ray.
- `host`: `SandboxHost`, the actor of one Docker daemon (its pools, its episodes), and `HostReaper`,
  its detached janitor.
- `bridge`: the driver's engine served to the hosts' episodes.
- `fleet`: `Fleet`, which stands where `SandboxPools` stands on one machine: the runner hands it each
  episode, it picks a host, copies the image there if need be, and requeues what a lost host ran.

May import `swerl.rollout.runner`, `swerl.agent`, `swerl.sandbox` and `swerl.structs`; Ray is imported only
when a fleet starts (`pip install -e '.[ray]'`), so one machine never needs it.
"""

from swerl.cluster.config import ClusterConfig, HostConfig, RayConfig
from swerl.cluster.fleet import Fleet, FleetError, FleetEvent, FleetUnavailable

__all__ = ["ClusterConfig", "Fleet", "FleetError", "FleetEvent", "FleetUnavailable", "HostConfig",
           "RayConfig"]
