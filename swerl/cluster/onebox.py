"""A cluster on one machine, to try the distributed path (and to test and benchmark it) without a second
machine: more Docker daemons beside the first, a Ray cluster of a head and one node per sandbox host, and
network hosts of their own (`netns_node`: a network namespace with its own address, which reaches this
machine only over a link, never over loopback).

    with extra_daemon("/run/swerl-d2") as url, onebox_cluster(["a", "b"]) as cluster:
        ClusterConfig(backend="ray", ray=RayConfig(address=cluster.address),
                      hosts=(HostConfig(name="b", docker_url=url),))

An extra daemon has its own data root, exec root, socket, pid file and bridge, and no iptables rules
(sandboxes run with no network), so it starts in seconds and sees only its own containers. Its bridge is
an empty one of its own, never `--bridge=none`: dockerd started that way deletes the host's `docker0`,
the first daemon's bridge, and every container the first daemon then starts on its default network fails.
Needs root and iproute2, like dockerd itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.cluster.config import HOST_RESOURCE_PREFIX
from swerl.sandbox.images import save_image

FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
               "health_check_initial_delay_ms": 0}
"""Ray's node health checks at 500 ms x 3: a node that is gone is seen in about 1.5 s (the default, 3 s x 5,
takes 15 s)."""


def _stop_stale(pidfile: Path) -> None:
    """A daemon of the same name left by a run that was killed: stop it (its containerd goes with it)."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    for _ in range(120):
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.25)


@contextlib.contextmanager
def extra_daemon(name: str, *, images: Sequence[str] = (), source: Any = None,
                 timeout_s: float = 60.0) -> Iterator[str]:
    """A second Docker daemon `name` (socket /run/<name>.sock, data in /var/lib/<name>, log in
    /tmp/<name>.log) holding `images` (loaded from `source`, the first daemon's client, unless present);
    yields its URL. Leaving stops it, its containers removed; the data root (the loaded images) stays for
    the next time."""
    import docker

    if shutil.which("dockerd") is None:
        raise RuntimeError("dockerd is not installed — scripts/ensure_docker.sh installs Debian's docker.io")
    url = f"unix:///run/{name}.sock"
    _stop_stale(Path(f"/run/{name}.pid"))
    bridge = "swb-" + hashlib.sha256(name.encode()).hexdigest()[:10]  # interface names: 15 characters
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], capture_output=True)  # may exist
    subprocess.run(["ip", "link", "set", bridge, "up"], check=True, capture_output=True)
    log = open(f"/tmp/{name}.log", "ab")  # noqa: SIM115 - the daemon writes to it until it stops
    proc = subprocess.Popen(
        ["dockerd", f"--data-root=/var/lib/{name}", f"--exec-root=/run/{name}", f"-H={url}",
         f"--pidfile=/run/{name}.pid", f"--bridge={bridge}", "--iptables=false", "--ip6tables=false"],
        stdout=log, stderr=log, start_new_session=True)
    client: Any = None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:  # the client asks the daemon's API version as it is made
                client = docker.DockerClient(base_url=url, timeout=120)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dockerd {name} did not come up — see /tmp/{name}.log") from None
                time.sleep(0.25)
        have = {t for im in client.images.list() for t in im.tags}
        for image in images:
            if image not in have:
                client.images.load(save_image(source, image))
        yield url
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                for c in client.containers.list(all=True):
                    c.remove(force=True)
            client.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        Path(f"/run/{name}.pid").unlink(missing_ok=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@dataclass(frozen=True)
class NetNode:
    """A network host on this machine (`netns_node`)."""

    name: str
    """The network namespace."""
    address: str
    """The node's address on the link."""
    peer: str
    """This machine's address on the link: where the node reaches it."""
    interface: str
    """The node's end of the link (its GLOO_SOCKET_IFNAME, say)."""

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the node (its own network: loopback and the link only; the same files)."""
        return ["ip", "netns", "exec", self.name, *argv]


def _netns_down(name: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)  # its end of the link goes with it


@contextlib.contextmanager
def netns_node(name: str, subnet: int = 77) -> Iterator[NetNode]:
    """A second network host: namespace `name` joined to this one by a veth pair on 10.<subnet>.0.0/24
    (this machine .1, the node .2), its loopback up. What runs in it shares this machine's files and
    processes but not its network: a peer on this machine is reachable at `peer` only, and a process that
    assumes loopback or the hostname's address fails as it would on another machine. Leaving kills what
    still runs in it and removes it. Needs root and iproute2."""
    here, there = f"swn{subnet}-h", f"swn{subnet}-n"
    _netns_down(name)
    subprocess.run(["ip", "link", "del", here], capture_output=True)
    node = NetNode(name, f"10.{subnet}.0.2", f"10.{subnet}.0.1", there)
    steps = [["ip", "netns", "add", name],
             ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
             ["ip", "link", "set", there, "netns", name],
             ["ip", "addr", "add", f"{node.peer}/24", "dev", here], ["ip", "link", "set", here, "up"],
             node.command(["ip", "addr", "add", f"{node.address}/24", "dev", there]),
             node.command(["ip", "link", "set", there, "up"]),
             node.command(["ip", "link", "set", "lo", "up"])]
    try:
        for step in steps:
            r = subprocess.run(step, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(step)}: {r.stderr.strip()} (netns_node needs root and "
                                   "iproute2)")
        yield node
    finally:
        _netns_down(name)
        subprocess.run(["ip", "link", "del", here], capture_output=True)


class OneBox:
    """A Ray `Cluster` of a head and one node per sandbox host; nodes come and go by host name."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.nodes: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_host(self, name: str, num_cpus: int = 1) -> None:
        """Start a node offering sandbox host `name` (its actor starts or restarts there)."""
        self.nodes[name] = self.cluster.add_node(num_cpus=num_cpus,
                                                 resources={HOST_RESOURCE_PREFIX + name: 1})

    def remove_host(self, name: str) -> None:
        """Remove host `name`'s node as a lost machine goes: its processes killed, nothing cleaned up."""
        self.cluster.remove_node(self.nodes.pop(name))


@contextlib.contextmanager
def onebox_cluster(hosts: Sequence[str], *, health: dict[str, int] | None = None) -> Iterator[OneBox]:
    """A Ray head and a node for each of `hosts` on this machine; leaving stops them all."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": health or FAST_HEALTH})
    box = OneBox(c)
    try:
        for h in hosts:
            box.add_host(h)
        yield box
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
