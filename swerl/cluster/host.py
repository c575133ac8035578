"""A sandbox host: the Ray actor that owns one Docker daemon, its sandboxes and the episodes that use them.

`SandboxHost` runs on the node that offers its `swerl_host_<name>` resource and drives that node's
daemon (or the one `docker_url` names). It owns the host's `SandboxPools` (warm sandboxes, its container
budget), runs each episode it is given through the same `EpisodeRunner.run_one` as one machine does, so a
tool call never leaves the node, and generates either straight from the inference servers the driver's
engine uses (SGLang or vLLM: a client of its own, attached to the workers the driver has in rotation, or
their router) or through the driver's engine (`swerl.cluster.bridge`: the in-process hf engine). Only the
finished `EpisodeResult` goes back.

`HostReaper` is the host's janitor, a detached actor beside it: it outlives the driver and the host
actor (a killed driver takes its actors down with SIGKILL, which runs no cleanup), and removes the
containers whose owner process is gone or whose `swerl.expires` label has passed; it leaves once the
daemon holds no swerl container for a few passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from swerl.agent.env import EpisodeSpec
from swerl.cluster.bridge import BridgeEngine
from swerl.rollout.config import ServerConfig
from swerl.rollout.runner import EpisodeRunner, ensure_threads
from swerl.sandbox import lifecycle
from swerl.sandbox.images import save_image
from swerl.sandbox.pool import SandboxPools
from swerl.structs import EpisodeLimits, EpisodeResult, SamplingParams, SandboxSpec, size_bytes


@dataclass(frozen=True)
class HostInfo:
    """What a host reports when pinged."""

    name: str
    node_id: str
    pid: int
    capacity: int
    cores: int
    memory_bytes: int
    images: tuple[str, ...]
    """Tags of the images its daemon holds."""
    ip: str
    """Its node's address (Ray's node IP): servers on the driver's loopback are reachable only from a host
    with the driver's."""
    docker_ok: bool
    """The daemon answered."""
    error: str = ""
    """Why the daemon did not answer."""


@dataclass(frozen=True)
class EpisodeOptions:
    """How a host runs the episodes of one run (the driver runner's settings)."""

    params: SamplingParams
    limits: EpisodeLimits
    engine_timeout_s: float | None
    engine_concurrency: int
    train_step: int | None
    servers: ServerConfig | None = None
    """Generate straight from these servers (the driver's engine's workers in rotation, or its router), with
    a client of the host's own; None: through the driver's engine (the bridge)."""


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def auto_capacity(cores: int, memory_bytes: int, spec: SandboxSpec | None = None) -> int:
    """Sandboxes a host of `cores` and `memory_bytes` runs at once: one per `spec.cpus` cores and per
    `spec.memory`, whichever allows fewer (at least 1)."""
    spec = spec or SandboxSpec()
    by_cpu = int(cores // spec.cpus)
    by_mem = int(memory_bytes // size_bytes(spec.memory, "SandboxSpec.memory")) if memory_bytes else by_cpu
    return max(1, min(by_cpu, by_mem))


PROBE_TIMEOUT_S = 10
"""Seconds a heartbeat's request to the daemon may take (a work request may take 120)."""


def docker_client(docker_url: str, timeout: int = 120) -> Any:
    """The client of the host's daemon: `docker_url`, else the node's own (DOCKER_HOST or the socket)."""
    if not docker_url:
        return lifecycle.docker_client(timeout=timeout)
    import docker

    client = docker.DockerClient(base_url=docker_url, timeout=timeout)
    client.ping()
    return client


class SandboxHost:
    """The actor of one sandbox host (see the module docstring)."""

    def __init__(self, name: str, docker_url: str, capacity: int, run_id: str, warm: int,
                 ttl_s: float, bridge: Any) -> None:
        self.name, self.docker_url, self.run_id = name, docker_url, run_id
        self.warm, self.ttl_s, self.bridge = warm, ttl_s, bridge
        self.cores = os.cpu_count() or 1
        self.memory = _memory_bytes()
        self.capacity = capacity or auto_capacity(self.cores, self.memory)
        self.client: Any = None
        self.pools: SandboxPools | None = None
        self.tokenizer: Any = None
        self._engine_slots: asyncio.Semaphore | None = None
        self._clients: dict[ServerConfig, Any] = {}  # server clients, one per set of workers
        self._client_lock = asyncio.Lock()
        # heartbeats probe the daemon in a thread of their own, with a client of their own (short
        # timeout): one queued behind the episodes' tool calls (which hold the loop's pool for their
        # whole length) would miss and get a busy host marked lost. One probe at a time: the pings that
        # arrive meanwhile wait for its answer, so a slow one does not queue more behind it.
        self._health = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swerl-health")
        self._health_client: Any = None
        self._probing: dict[bool, asyncio.Future[list[dict[str, Any]]]] = {}
        lifecycle.install_handlers()

    async def _client(self) -> Any:
        if self.client is None:
            self.client = await asyncio.to_thread(docker_client, self.docker_url)
        return self.client

    async def _probe(self, images: bool) -> list[dict[str, Any]]:
        """Ping the daemon (and list its images when `images`) from the health thread; raises when it
        does not answer."""
        def probe() -> list[dict[str, Any]]:
            try:
                if self._health_client is None:
                    self._health_client = docker_client(self.docker_url, timeout=PROBE_TIMEOUT_S)
                self._health_client.ping()
                # the low-level list: one request (the high-level one inspects every image, a request each)
                return self._health_client.api.images() if images else []
            except Exception:
                self._health_client = None  # a daemon that comes back gets a fresh connection
                raise

        running = self._probing.get(images)
        if running is None or running.done():
            running = asyncio.get_running_loop().run_in_executor(self._health, probe)
            self._probing[images] = running
        return await asyncio.shield(running)

    async def info(self, images: bool = True) -> HostInfo:
        """The host's state; `images`: with the tags its daemon holds (a heartbeat of a host already up
        skips them: the fleet tracks what it copied)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        ip = ray.util.get_node_ip_address()
        try:
            listed = await self._probe(images)
            tags = [t for im in listed for t in im.get("RepoTags") or () if t != "<none>:<none>"]
        except Exception as e:  # the daemon is down: the host is there, its sandboxes are not
            self.client = None  # the work's client, made again once the daemon answers
            return HostInfo(self.name, node, os.getpid(), self.capacity, self.cores, self.memory, (), ip,
                            False, f"{type(e).__name__}: {e}")
        return HostInfo(self.name, node, os.getpid(), self.capacity, self.cores, self.memory,
                        tuple(sorted(tags)), ip, True)

    async def begin(self, specs: list[SandboxSpec], tokenizer: Any) -> None:
        """A run starts: the sandboxes it will take here, in order (made ahead as on one machine)."""
        self.tokenizer = tokenizer
        ensure_threads(2 * self.capacity + 4)  # its episodes, its warm starts, and the results
        if self.pools is None:
            self.pools = SandboxPools(warm=min(self.warm, self.capacity),
                                      max_containers=self.capacity + min(self.warm, self.capacity),
                                      run_id=self.run_id, client=await self._client(), ttl_s=self.ttl_s)
            await self.pools.__aenter__()
        await self.pools.begin(specs)

    async def end(self) -> None:
        if self.pools is not None:
            await self.pools.end()

    async def run_episode(self, spec: EpisodeSpec, opts: EpisodeOptions) -> EpisodeResult:
        """One episode here; a failure of the episode is its result. The daemon gone under it is the host's
        loss, not the episode's: kind `host`, for the fleet to run it elsewhere."""
        if self.pools is None:
            raise RuntimeError(f"host {self.name}: run_episode before begin")
        if self._engine_slots is None:
            self._engine_slots = asyncio.Semaphore(opts.engine_concurrency)
        engine = (BridgeEngine(self.bridge) if opts.servers is None
                  else await self._server_client(opts.servers))
        runner = EpisodeRunner(engine, self.tokenizer, params=opts.params,
                               limits=opts.limits, engine_timeout_s=opts.engine_timeout_s, pools=self.pools,
                               train_step=opts.train_step, progress=False)
        result = await runner.run_one(spec, self._engine_slots, self.pools)
        if result.error_kind == "sandbox" and not await self._daemon_ok():
            result = EpisodeResult(task_id=result.task_id, group=result.group, sample=result.sample,
                                   trajectory=None, error=f"host {self.name}: its Docker daemon is gone "
                                   f"({result.error})", error_kind="host", stats=result.stats,
                                   train_step=result.train_step)
        return dataclasses.replace(result, host=self.name)

    async def _server_client(self, servers: ServerConfig) -> Any:
        """The host's own client of `servers` (attached once, checked as the driver's was: health, release,
        model). The driver's workers in rotation are part of the key: once the driver drops a worker, the
        next episodes use a client without it, so no host generates from a worker that misses weight
        updates."""
        async with self._client_lock:
            if servers not in self._clients:
                from swerl.rollout.factory import attach_engine

                self._clients[servers] = await attach_engine(servers)
            return self._clients[servers]

    async def _daemon_ok(self) -> bool:
        try:
            await self._probe(images=False)
            return True
        except Exception:
            return False

    async def import_image(self, data: bytes) -> list[str]:
        """Load an image archive (`docker save`) into this host's daemon; the tags it brought."""
        client = await self._client()
        images = await asyncio.to_thread(client.images.load, data)
        return [t for im in images for t in im.tags]

    async def export_image(self, tag: str) -> bytes:
        client = await self._client()
        return await asyncio.to_thread(save_image, client, tag)

    async def close(self) -> None:
        """Remove every sandbox of the run here (and close the server clients)."""
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        if self.pools is not None:
            await self.pools.aclose()
            self.pools = None
        if self.client is not None:
            await asyncio.to_thread(lifecycle.reap, run_id=self.run_id, client=self.client)


class HostReaper:
    """The detached janitor of one host's daemon (see the module docstring). Its passes run in a thread
    of its own from the moment it is made, so they go on whatever becomes of the driver; it leaves when
    none of the host actors it watches is alive and the daemon holds no container of this node's for
    `idle_passes` passes in a row."""

    def __init__(self, name: str, docker_url: str, interval_s: float, idle_passes: int = 3) -> None:
        self.name, self.docker_url = name, docker_url
        self.interval_s, self.idle_passes = interval_s, idle_passes
        self.hostname = socket.gethostname()
        self._watched: set[str] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name=f"swerl-reaper-{name}", daemon=True).start()

    def watch(self, actor_name: str) -> str:
        """Stay while the named host actor lives; the node's hostname (what owner labels carry)."""
        with self._lock:
            self._watched.add(actor_name)
        return self.hostname

    def _owners_alive(self) -> bool:
        import ray

        with self._lock:
            names = list(self._watched)
        alive = []
        for n in names:
            try:
                ray.get_actor(n)
                alive.append(n)
            except ValueError:  # gone for good (killed, or its driver died)
                pass
        with self._lock:
            self._watched &= set(alive) | (self._watched - set(names))  # keep those added meanwhile
        return bool(alive)

    def _loop(self) -> None:
        import ray

        idle = 0
        while idle < self.idle_passes:
            time.sleep(self.interval_s)
            try:
                client = docker_client(self.docker_url)
                lifecycle.reap(client=client)
                left = client.containers.list(all=True, filters={"label": f"{lifecycle.LABEL_MANAGED}=1"})
            except Exception:  # the daemon is down: nothing to reap until it is back (or no one needs it)
                idle = 0 if self._owners_alive() else idle + 1
                continue
            mine = [c for c in left if c.labels.get(lifecycle.LABEL_HOST) == self.hostname]
            idle = 0 if mine or self._owners_alive() else idle + 1
        # nothing left to watch: leave (the next run's fleet starts a new one)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
