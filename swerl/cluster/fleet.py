"""The fleet: sandbox hosts on a Ray cluster, and the dispatcher that spreads episodes over them.

    with Fleet(cfg.cluster, run_id=...) as fleet:                 # Ray, the hosts, their reapers
        await run_episodes(specs, engine, tokenizer, pools=fleet)  # each episode on a host, by its sandbox

A `Fleet` stands where `SandboxPools` stands on one machine (the runner takes either): `begin` / `end`
bracket a run, and `run_episode` sends one episode to a host (`swerl.cluster.schedule` picks it: free
slots, image locality, turns), copies the episode's image there first if the host lacks it (`docker save`
on a host that has it, or this machine's daemon, then `docker load`: no registry), and waits for the
result. The host generates straight from the driver's engine's inference servers (SGLang, vLLM: the
workers it has in rotation, or its router), or through the driver's engine itself (`swerl.cluster.bridge`:
the in-process hf engine, or servers on a loopback the host cannot reach), as `cluster.generation` says.

Failover. A heartbeat pings every host each `heartbeat_s` (a host probes its daemon for it in a thread of
its own, so one with every sandbox in a tool call still answers); a host that misses `heartbeat_misses`
pings, whose daemon does not answer, or whose actor died under a call, is lost: the episodes it was
running are failed attempts (never scored) and start again on another host, up to `requeue` times; a
lost host's actor restarts where its `swerl_host_<name>` resource comes back, and a node that joins with a new
such resource becomes a host, both within a heartbeat. Only when no host is left for `start_timeout_s`
does the run stop (`FleetUnavailable`). The fleet's own work runs on an event loop in a thread of its
own, so the heartbeat goes on between the caller's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from swerl.agent.env import EpisodeSpec
from swerl.cluster.bridge import EngineBridge, serve
from swerl.cluster.config import HOST_RESOURCE_PREFIX, ClusterConfig
from swerl.cluster.host import EpisodeOptions, HostInfo, HostReaper, SandboxHost
from swerl.cluster.schedule import NoHostLeft, Scheduler
from swerl.net import is_loopback
from swerl.rollout.config import ServerConfig
from swerl.sandbox.errors import SandboxError
from swerl.structs import EpisodeResult, EpisodeStats, SandboxSpec

T = TypeVar("T")


class FleetError(SandboxError):
    """The cluster cannot run episodes (no Ray, no host, a host's daemon down at start)."""


class FleetUnavailable(FleetError):
    """Every host was lost mid-run and none came back in time: nothing can run."""


@dataclass
class _Host:
    """The fleet's record of one host."""

    name: str
    actor: Any
    reaper: Any
    info: HostInfo | None = None
    misses: int = 0
    lost: asyncio.Event = field(default_factory=asyncio.Event)  # set when this incarnation is lost
    begun: asyncio.Future[None] | None = None  # telling it about the current run (its tokenizer too)
    image_locks: dict[str, asyncio.Lock] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetEvent:
    """Something the fleet saw (the failover timeline): `t` seconds since the fleet started."""

    t: float
    kind: str
    """`host_up`, `host_lost`, `requeued`, `image_copied`."""
    host: str
    detail: str = ""


def _check_reachable(address: str) -> None:
    """Fail in seconds on a head that does not answer (ray.init retries for minutes)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise FleetError(f"cluster.ray.address={address!r} is not host:port (or auto, local) — give the "
                         "head's GCS address, e.g. 10.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise FleetError(f"cannot reach the Ray cluster at cluster.ray.address={address!r} ({e}) — start it "
                         "with `ray start --head`, or fix cluster.ray.address") from e


class Fleet:
    """Sandbox hosts on a Ray cluster; see the module docstring."""

    def __init__(self, cfg: ClusterConfig, *, run_id: str, warm: int = 2,
                 log: Callable[[str], None] | None = None) -> None:
        self.cfg, self.run_id, self.warm, self.log = cfg, run_id, warm, log
        self.events: list[FleetEvent] = []
        self.episodes: Counter[str] = Counter()  # results per host (failed attempts not counted)
        self.routes: Counter[str] = Counter()  # episode attempts by how they generated: direct, bridge
        self._t0 = time.monotonic()
        self._hosts: dict[str, _Host] = {}
        self._sched = Scheduler()
        self._slot_freed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._bridge: Any = None
        # (loop, engine) -> (session, its serve task): the driver's engine answering the hosts
        self._serving: dict[tuple[int, int], tuple[int, asyncio.Task[None]]] = {}
        self._sessions = itertools.count()
        self._run_specs: list[SandboxSpec] = []
        self._tokenizer_ref: tuple[Any, Any] | None = None  # (tokenizer, its ObjectRef)
        self._archives: dict[str, Any] = {}  # image -> ObjectRef of its `docker save` archive
        self._lost_once: set[str] = set()  # hosts lost at least once (their janitor may have gone too)
        self._ray_started = False
        self._ray: Any = None
        self._ip = ""  # the driver's node address

    # ---- lifecycle ------------------------------------------------------------------------------------

    def __enter__(self) -> Fleet:
        try:
            import ray
        except ImportError as e:
            raise FleetError("cluster.backend=ray needs Ray — install the extra: "
                             "pip install -e '.[ray]'") from e
        self._ray = ray
        self._connect()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swerl-fleet", daemon=True)
        self._thread.start()
        try:
            self._call_sync(self._start())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._call_sync(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._loop.close()
            self._loop = None
        if self._ray_started:
            self._ray.shutdown()
            self._ray_started = False

    def _connect(self) -> None:
        ray, r = self._ray, self.cfg.ray
        if ray.is_initialized():
            return
        if r.address not in ("auto", "local"):
            _check_reachable(r.address)
        try:
            if r.address == "local":
                ray.init(address="local", namespace=r.namespace, include_dashboard=False, log_to_driver=False,
                         resources={HOST_RESOURCE_PREFIX + "local": 1})  # this machine: one host
            else:
                ray.init(address=r.address, namespace=r.namespace, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FleetError(f"cannot reach the Ray cluster at cluster.ray.address={r.address!r} ({first}) — "
                             "start it with `ray start --head` (and `ray start --address HEAD:6379` on each "
                             "node), or set cluster.ray.address") from e
        self._ray_started = True

    def _call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the fleet's loop, awaited from any other loop."""
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def clock(self) -> float:
        """Seconds since the fleet started: the clock of its events."""
        return time.monotonic() - self._t0

    def _event(self, kind: str, host: str, detail: str = "") -> None:
        ev = FleetEvent(round(self.clock(), 3), kind, host, detail)
        self.events.append(ev)
        if self.log is not None and kind != "image_copied":
            self.log(f"fleet: {kind} {host}" + (f" ({detail})" if detail else ""))

    async def _start(self) -> None:
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._slot_freed = asyncio.Condition()
        self._ip = ray.util.get_node_ip_address()
        here = ray.get_runtime_context().get_node_id()
        self._bridge = ray.remote(EngineBridge).options(
            num_cpus=0, max_concurrency=100_000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)).remote()
        offered = self._offered()
        for h in self.cfg.hosts:
            if h.name not in offered:
                raise FleetError(f"cluster.hosts: no Ray node offers resource {h.resource} — start that node "
                                 f"with `ray start --address HEAD:6379 "
                                 f"--resources='{{\"{h.resource}\": 1}}'`")
        if not offered:
            raise FleetError(f"no Ray node offers a sandbox host (a resource {HOST_RESOURCE_PREFIX}<name>) — "
                             f"start each Docker node with `ray start --address HEAD:6379 "
                             f"--resources='{{\"{HOST_RESOURCE_PREFIX}a\": 1}}'`")
        for name in sorted(offered):
            self._add_host(name)
        # every host answers, its daemon up, before any work (a daemon gets a few beats to answer), and at
        # least min_hosts of them (nodes may still be joining)
        started = time.monotonic()
        while True:
            for name in self._offered() - set(self._hosts):
                self._add_host(name)
            await self._beat()
            answered = [h.info for h in self._hosts.values() if h.info is not None]
            broken = [i for i in answered if not i.docker_ok]
            waited = time.monotonic() - started
            if broken and waited >= 3 * self.cfg.heartbeat_s:
                raise FleetError(f"host {broken[0].name}: its Docker daemon does not answer "
                                 f"({broken[0].error}) — start dockerd on that node, or set "
                                 "cluster.hosts[].docker_url")
            up = len(answered) - len(broken)
            if not broken and len(answered) == len(self._hosts) and up >= self.cfg.min_hosts:
                break
            if waited > self.cfg.start_timeout_s:
                raise FleetError(f"{up} of cluster.min_hosts={self.cfg.min_hosts} sandbox hosts answered "
                                 f"within {self.cfg.start_timeout_s:.0f} s — check the nodes (`ray status`)")
            await asyncio.sleep(min(0.2, self.cfg.heartbeat_s))
        self._heartbeat = asyncio.create_task(self._heartbeat_loop())

    def _offered(self) -> set[str]:
        """Host names the cluster's live nodes offer (`swerl_host_<name>` resources); with `discover` off,
        only those `hosts` names."""
        names = set()
        for node in self._ray.nodes():
            if node.get("Alive"):
                names |= {k[len(HOST_RESOURCE_PREFIX):] for k in node.get("Resources", {})
                          if k.startswith(HOST_RESOURCE_PREFIX)}
        return names if self.cfg.discover else names & {h.name for h in self.cfg.hosts}

    def _add_host(self, name: str) -> None:
        ray, hc = self._ray, self.cfg.host(name)
        pin = {"resources": {hc.resource: 0.001}, "num_cpus": 0}
        actor = ray.remote(SandboxHost).options(
            name=f"swerl-host-{self.run_id}-{name}", max_restarts=-1, max_task_retries=0,
            max_concurrency=1000, **pin).remote(
            name, hc.docker_url, hc.capacity, self.run_id, self.warm, self.cfg.sandbox_ttl_s, self._bridge)
        self._hosts[name] = _Host(name, actor, self._reaper(name))

    def _reaper(self, name: str) -> Any:
        """The host's detached janitor (the one running, or a new one), watching this run's host actor."""
        hc = self.cfg.host(name)
        reaper = self._ray.remote(HostReaper).options(
            name=f"swerl-reaper-{name}", lifetime="detached", get_if_exists=True, max_restarts=0,
            resources={hc.resource: 0.001}, num_cpus=0).remote(name, hc.docker_url, self.cfg.reap_interval_s)
        reaper.watch.remote(f"swerl-host-{self.run_id}-{name}")
        return reaper

    async def _shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(BaseException):
                await self._heartbeat
        closing = [asyncio.wait_for(h.actor.close.remote(), 60) for h in self._hosts.values()]
        await asyncio.gather(*closing, return_exceptions=True)
        for h in self._hosts.values():
            with contextlib.suppress(Exception):
                self._ray.kill(h.actor, no_restart=True)
        if self._bridge is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(self._bridge, no_restart=True)

    # ---- health -----------------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            with contextlib.suppress(Exception):
                for name in self._offered() - set(self._hosts):
                    self._add_host(name)  # a node joined with a new host resource
            await self._beat()

    async def _beat(self) -> None:
        """Ping every host once; mark the lost ones down and the ones back up."""
        async def ping(h: _Host) -> None:
            try:
                slot = self._sched.hosts.get(h.name)
                up = slot is not None and slot.up
                info = await asyncio.wait_for(h.actor.info.remote(images=not up), self.cfg.heartbeat_s * 2)
            except Exception:
                h.misses += 1
                if h.misses >= self.cfg.heartbeat_misses:
                    self._lose(h, f"missed {h.misses} heartbeats")
                return
            h.misses = 0
            restarted = h.info is not None and info.pid != h.info.pid
            h.info = info
            if restarted and up:  # what it ran died with it; the next beat adds it back, images listed
                self._lose(h, "its actor restarted")
                return
            if not info.docker_ok:
                self._lose(h, f"daemon: {info.error}")
            elif not up:
                self._sched.add(h.name, info.capacity, set(info.images))
                h.lost, h.begun = asyncio.Event(), None
                if restarted or h.name in self._lost_once:  # its node came back: its janitor too
                    h.reaper = self._reaper(h.name)
                self._event("host_up", h.name, f"capacity {info.capacity}")
                await self._notify()

        await asyncio.gather(*(ping(h) for h in list(self._hosts.values())))

    def _lose(self, h: _Host, why: str) -> None:
        s = self._sched.hosts.get(h.name)
        if s is not None and s.up:
            self._lost_once.add(h.name)
            self._sched.down(h.name)
            h.lost.set()
            self._event("host_lost", h.name, why)

    async def _notify(self) -> None:
        assert self._slot_freed is not None
        async with self._slot_freed:
            self._slot_freed.notify_all()

    # ---- runs (called from the caller's event loop) -------------------------------------------------------

    async def begin(self, specs: Sequence[SandboxSpec]) -> None:
        await self._call(self._begin(list(specs)))

    async def _begin(self, specs: list[SandboxSpec]) -> None:
        self._run_specs = specs
        for h in self._hosts.values():
            h.begun = None

    async def end(self) -> None:
        loop = asyncio.get_running_loop()
        for key, (session, task) in list(self._serving.items()):
            if key[0] == id(loop):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                del self._serving[key]
                with contextlib.suppress(Exception):  # its long poll, still waiting in the bridge, gives up
                    await self._bridge.close.remote(session)
        await self._call(self._end())

    async def _end(self) -> None:
        begun = [h.actor.end.remote() for h in self._hosts.values() if h.begun is not None]
        await asyncio.gather(*begun, return_exceptions=True)

    async def run_episode(self, spec: EpisodeSpec, runner: Any) -> EpisodeResult:
        """Run `spec` on a host with `runner`'s engine, sampling settings and limits."""
        loop = asyncio.get_running_loop()
        key = (id(loop), id(runner.engine))
        if key not in self._serving:  # the driver's engine answers the hosts from this loop, for this run
            session = next(self._sessions)
            self._serving[key] = (session, asyncio.create_task(
                serve(self._bridge, runner.engine, runner.engine_concurrency, session)))
        serving = self._serving[key][1]
        opts = EpisodeOptions(runner.params, runner.limits, runner.engine_timeout_s,
                              runner.engine_concurrency, runner.train_step,
                              servers=self._servers(runner.engine))
        episode = asyncio.ensure_future(self._call(self._dispatch(spec, opts, runner.tokenizer)))
        # the serve loop ending (its bridge actor gone) would leave every episode waiting for its engine
        await asyncio.wait({episode, serving}, return_when=asyncio.FIRST_COMPLETED)
        if not episode.done():
            episode.cancel()
            err = serving.exception() if not serving.cancelled() else None
            raise FleetError(f"the engine bridge stopped ({type(err).__name__}: {err}) — the hosts can no "
                             "longer generate; see the Ray logs (`ray status`)") from err
        return episode.result()

    async def _dispatch(self, spec: EpisodeSpec, opts: EpisodeOptions, tokenizer: Any) -> EpisodeResult:
        image = spec.sandbox.image if spec.sandbox is not None else None
        lost_attempts: list[str] = []
        while True:
            h = await self._slot(image)
            try:
                if image is not None:
                    await self._ensure_image(h, image)
                await self._ensure_begun(h, tokenizer)
                routed = self._route(h, opts)
                self.routes["bridge" if routed.servers is None else "direct"] += 1
                call = asyncio.ensure_future(h.actor.run_episode.remote(spec, routed))
                lost = asyncio.ensure_future(h.lost.wait())
                done, _ = await asyncio.wait({call, lost}, return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                if call in done:
                    result = call.result()  # an actor that died under the call raises here
                else:
                    call.cancel()
                    raise ConnectionError("lost while the episode ran")
            except self._lost_errors() as e:
                self._lose(h, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                result = None
                why = f"host {h.name} lost: {type(e).__name__}"
            finally:
                self._sched.done(h.name)
                await self._notify()
            if result is not None and result.error_kind != "host":
                self.episodes[h.name] += 1
                return result
            if result is not None:
                self._lose(h, result.error)
                why = result.error
            lost_attempts.append(why)
            if len(lost_attempts) > self.cfg.requeue:
                return EpisodeResult(task_id=spec.task_id, group=spec.group, sample=spec.sample,
                                     trajectory=None, error=f"{len(lost_attempts)} hosts lost under the "
                                     "episode: " + "; ".join(lost_attempts), error_kind="host",
                                     stats=EpisodeStats(), train_step=opts.train_step, host=h.name)
            self._event("requeued", h.name, f"{spec.task_id} g{spec.group} s{spec.sample}")

    def _servers(self, engine: Any) -> ServerConfig | None:
        """The servers hosts may generate from directly: the driver's engine's config with the workers it has
        in rotation now (so a worker it dropped is dropped on the hosts too); None for the bridge."""
        from swerl.rollout.server import ServerEngine

        if self.cfg.generation == "bridge" or not isinstance(engine, ServerEngine):
            if self.cfg.generation == "direct":
                raise FleetError("cluster.generation=direct needs inference servers (rollout.engine sglang "
                                 f"or vllm), not {type(engine).__name__} — use cluster.generation=auto or "
                                 "bridge")
            return None
        key = engine.config.api_key or os.environ.get("SWERL_API_KEY", "")
        return dataclasses.replace(engine.config, urls=engine.live, api_key=key)

    def _route(self, h: _Host, opts: EpisodeOptions) -> EpisodeOptions:
        """`opts` for host `h`: direct when it reaches the servers (a loopback server only from the driver's
        machine), else through the bridge (`cluster.generation=direct`: an error naming the server)."""
        servers = opts.servers
        if servers is None:
            return opts
        urls = servers.urls + ((servers.router_url,) if getattr(servers, "router_url", "") else ())
        local = [u for u in urls if is_loopback(urlsplit(u).hostname or "")]
        if not local or (h.info is not None and h.info.ip == self._ip):
            return opts
        if self.cfg.generation == "direct":
            where = h.info.ip if h.info else "?"
            raise FleetError(f"cluster.generation=direct: host {h.name} ({where}) cannot reach the server at "
                             f"{local[0]} on the driver's loopback — serve on an address the hosts reach "
                             "(the engine's host / urls), or use cluster.generation=auto")
        return dataclasses.replace(opts, servers=None)

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        exc = self._ray.exceptions
        return (exc.RayActorError, exc.ActorUnavailableError, exc.ObjectLostError, exc.OwnerDiedError,
                exc.WorkerCrashedError, exc.NodeDiedError, ConnectionError)

    async def _slot(self, image: str | None) -> _Host:
        """A host with a free slot (waiting for one); `FleetUnavailable` when none is up for
        `start_timeout_s`."""
        assert self._slot_freed is not None
        since: float | None = None
        async with self._slot_freed:
            while True:
                try:
                    name = self._sched.pick(image)
                    since = None
                except NoHostLeft:
                    name = None
                    since = since or time.monotonic()
                    if time.monotonic() - since > self.cfg.start_timeout_s:
                        raise FleetUnavailable(
                            "every sandbox host is lost and none came back within "
                            f"{self.cfg.start_timeout_s:.0f} s — check the nodes (`ray status`) and their "
                            "Docker daemons") from None
                if name is not None:
                    return self._hosts[name]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), self.cfg.heartbeat_s)

    async def _ensure_begun(self, h: _Host, tokenizer: Any) -> None:
        """Tell the host about the run (once; the episodes that come meanwhile wait for it): its share of the
        run's sandboxes to make ahead, and the tokenizer."""
        if h.begun is None:
            if self._tokenizer_ref is None or self._tokenizer_ref[0] is not tokenizer:
                self._tokenizer_ref = (tokenizer, self._ray.put(tokenizer))  # once per tokenizer, not per run
            up = sorted(self._sched.up)
            share = self._run_specs[up.index(h.name)::len(up)] if h.name in up else []
            h.begun = asyncio.ensure_future(h.actor.begin.remote(share, self._tokenizer_ref[1]))
        try:
            await asyncio.shield(h.begun)
        except BaseException:
            h.begun = None  # the next episode tries again (or finds the host lost)
            raise

    async def _ensure_image(self, h: _Host, image: str) -> None:
        """Copy `image` to the host if its daemon lacks it (once, however many episodes ask)."""
        lock = h.image_locks.setdefault(image, asyncio.Lock())
        async with lock:
            if image in self._sched.hosts[h.name].images:
                return
            t0 = time.monotonic()
            archive = await self._archive(image, exclude=h.name)
            tags = await h.actor.import_image.remote(archive)
            self._sched.has_image(h.name, image)
            for t in tags:
                self._sched.has_image(h.name, t)
            self._event("image_copied", h.name, f"{image} in {time.monotonic() - t0:.1f} s")

    async def _archive(self, image: str, exclude: str) -> Any:
        """The `docker save` archive of `image` in Ray's object store: from a host that holds it, else from
        this machine's daemon."""
        if image in self._archives:
            return self._archives[image]
        src = next((h for n, h in self._hosts.items() if n != exclude and n in self._sched.hosts
                    and self._sched.hosts[n].up and image in self._sched.hosts[n].images), None)
        if src is not None:
            ref = src.actor.export_image.remote(image)
        else:
            def local() -> bytes:
                from swerl.sandbox import lifecycle
                from swerl.sandbox.images import save_image

                return save_image(lifecycle.docker_client(), image)

            try:
                data = await asyncio.to_thread(local)
            except Exception as e:
                raise FleetError(f"image {image} is on no sandbox host and not on this machine ({e}) — "
                                 "build it on one (e.g. `swerl tasks build-images`)") from e
            ref = self._ray.put(data)
        self._archives[image] = ref
        return ref

    def hosts_up(self) -> list[str]:
        """The hosts that are up now, by name."""
        return self._call_sync(self._hosts_up())

    async def _hosts_up(self) -> list[str]:
        return sorted(self._sched.up)

