"""Weight sync in memory (`rollout.weight_sync: memory`): the learner streams its weights in buckets
(`Learner.iter_weight_buckets`, ZeRO-3 gathered module by module) to the rollout engine through the
engine's own weight-update API — no checkpoint written or read.

- hf: each bucket is copied into the in-process model (`HFEngine.update_weights_from_buckets`).
- SGLang: the learner's rank 0 and every server's TP ranks form one torch.distributed group (rank 0
  the learner; `/init_weights_update_group`, once, at the first sync), built the way SGLang builds its
  side (`init_custom_process_group`); each step is one `/begin_weight_update` ... `/end_weight_update`
  session with one `/update_weights_from_distributed` per bucket (`load_format: flattened_bucket`:
  one broadcast of the bucket's bytes). NCCL when the learner is on a GPU, gloo on CPU.
- vLLM: vLLM's weight transfer API (`/init_weight_transfer_engine`, `/start_weight_update`,
  `/update_weights`, `/finish_weight_update`) driven by vLLM's own trainer-side NCCL engine, its
  packed buffers the bucket size (`VLLMEngine.init_weight_transfer`). vLLM 0.32 has no CPU backend:
  a CPU server is refused when the engine opens.

Every learner rank calls `sync_in_memory` (the ZeRO-3 gathers are collective); only rank 0 has the
engine and sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch

from swerl.net import address_towards, interface_of, is_loopback, is_this_machine
from swerl.rollout.http import free_port

GROUP_NAME = "weight_update_group"
"""Prefix of the weight-sync groups' names (SGLang's default name, `UpdateWeightsFromDistributedReqInput.
group_name`, sglang 0.5.21 `srt/managers/io_struct.py` l. 1906; each engine's group adds its port)."""
GROUP_TIMEOUT_S = 600.0
"""How long a collective of the weight group may wait for its peers (a server that never joins or never
receives turns into an error after this, not a hang)."""


@dataclass(frozen=True)
class SyncStats:
    """What one weight sync moved."""

    buckets: int
    bytes: int
    seconds: float
    largest_bucket_bytes: int


def init_custom_process_group(backend: str, master_address: str, master_port: int, world_size: int,
                              rank: int, group_name: str = GROUP_NAME,
                              timeout_s: float = GROUP_TIMEOUT_S) -> Any:
    """A torch.distributed group outside the default one, built exactly as SGLang builds its side of
    the weight-update group (`init_custom_process_group`, sglang 0.5.21 `srt/utils/common.py`
    l. 2797-2860, called from `WeightUpdater.init_weights_update_group`,
    `srt/model_executor/model_runner_components/weight_updater.py` l. 124-132): a `tcp://` rendezvous
    (rank 0 hosts the TCPStore), the store prefixed by the group name, then torch's own group helper
    (which prefixes it again by `<group_name>/` and the device): any other key layout never meets the
    server's. Blocks until all `world_size` ranks have joined. The group name is registered in this
    process: one group of a name per process."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{_host_for_url(master_address)}:{master_port}", rank,
                                              world_size, timeout=timeout))
    store.set_timeout(timeout)
    with gloo_interface(backend, master_address if rank == 0 else None):
        pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend),
                                          PrefixStore(group_name, store), group_name=group_name,
                                          backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


@contextlib.contextmanager
def gloo_interface(backend: str, own_address: str | None) -> Iterator[None]:
    """For the `with` block, gloo binds to the interface holding `own_address` (this process's address
    in the group), unless GLOO_SOCKET_IFNAME says otherwise. Gloo's default is the address the hostname
    resolves to, which is loopback on many machines (127.0.0.1 or Debian's 127.0.1.1): peers on other
    machines would be told to connect to their own loopback."""
    iface = (interface_of(own_address) if backend == "gloo" and own_address and not is_loopback(own_address)
             and "GLOO_SOCKET_IFNAME" not in os.environ else None)
    if iface is None:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def check_disk_sync(rollout: Any, worker_urls: Iterable[str]) -> None:
    """Refuse `weight_sync: disk` with no `weights_dir` when a server runs on another machine: it would be
    asked to load a path that exists only on this one (SGLang and vLLM read the checkpoint from their own
    disk). One line, before any work."""
    if rollout.weight_sync != "disk" or rollout.weights_dir:
        return
    elsewhere = [u for u in worker_urls if not is_this_machine(urlsplit(u).hostname or "")]
    if elsewhere:
        from swerl.rollout.engine import EngineError

        raise EngineError(f"rollout.weight_sync=disk: the server at {elsewhere[0]} runs on another machine "
                          "and would load each step's weights from a directory of this one — set "
                          "rollout.weights_dir to a directory on a filesystem both share (the same path on "
                          "both), or use rollout.weight_sync=memory")


def _host_for_url(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def group_address(configured: str, urls: Iterable[str]) -> str:
    """Where the servers reach rank 0: `configured`, else 127.0.0.1 when every server listens on loopback,
    else the address this machine reaches the first other server from (`swerl.net.address_towards`: the
    route's source address, never the hostname's, which may be 127.0.1.1 or a bridge the servers cannot
    route to)."""
    if configured:
        return configured
    hosts = [urlsplit(u).hostname or "" for u in urls]
    remote = [h for h in hosts if not is_loopback(h)]
    if not remote:
        return "127.0.0.1"
    try:
        return address_towards(remote[0])
    except OSError as e:
        from swerl.rollout.engine import EngineError

        raise EngineError(f"rollout.weight_sync=memory: no route from this machine to the server at "
                          f"{remote[0]} ({e}) — set rollout.weight_group_address to the address the "
                          "servers reach the learner's rank 0 at") from e


class _SGLangGroup:
    """Rank 0's side of the weight group with an SGLang engine's workers."""

    def __init__(self, pg: Any, device: torch.device, name: str) -> None:
        self.pg = pg
        self.device = device
        self.name = name

    def broadcast(self, t: torch.Tensor) -> None:
        torch.distributed.broadcast(t, src=0, group=self.pg)


_GROUPS: weakref.WeakKeyDictionary[Any, _SGLangGroup] = weakref.WeakKeyDictionary()
"""Engine -> its weight group (set up at the first memory sync, kept for the engine's life)."""


def transfer_device(learner: Any) -> torch.device:
    """Where the buckets are copied to: the learner's GPU for NCCL, else the CPU (gloo)."""
    device = torch.device(learner.device)
    return device if device.type == "cuda" else torch.device("cpu")


def _in_daemon_thread(fn: Any, *args: Any) -> asyncio.Future[Any]:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            out = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            err = e
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_exception(err))
        else:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(out))

    threading.Thread(target=run, daemon=True, name="swerl-weight-group").start()
    return fut


async def _sglang_group(engine: Any, learner: Any, address: str) -> _SGLangGroup:
    group = _GROUPS.get(engine)
    if group is not None:
        return group
    device = transfer_device(learner)
    backend = "nccl" if device.type == "cuda" else "gloo"
    port = free_port(address if address not in ("localhost",) else "127.0.0.1")
    world_size = 1 + engine.config.tp * len(engine.live)
    name = f"{GROUP_NAME}_{port}"  # torch registers a group name once per process: one per engine
    # both sides block until the whole group joined: rank 0 in a thread while the servers are asked
    # (a daemon thread: if the servers never come, it must not keep the process from exiting)
    learner_side = _in_daemon_thread(init_custom_process_group, backend, address, port, world_size, 0, name)
    try:
        await engine.init_weights_update_group(address, port, world_size, group_name=name, backend=backend)
    except BaseException as e:
        from swerl.rollout.engine import EngineError

        raise EngineError(f"rollout.weight_sync=memory: the SGLang servers could not join the learner's "
                          f"{backend} weight group at {address}:{port} ({e}) — set "
                          "rollout.weight_group_address to an address they reach, or use "
                          "rollout.weight_sync=disk") from e
    group = _SGLangGroup(await learner_side, device, name)
    _GROUPS[engine] = group
    return group


async def sync_in_memory(rollout: Any, engine: Any, learner: Any) -> SyncStats:
    """One weight sync in memory (see the module docstring). `rollout`: the run's `RolloutConfig`;
    `engine`: rank 0's engine (None on the other ranks, which only take part in the gathers)."""
    from swerl.rollout.hf import HFEngine
    from swerl.rollout.sglang import SGLangEngine
    from swerl.rollout.vllm import VLLMEngine

    t0 = time.perf_counter()
    bucket_bytes = rollout.weight_bucket_bytes
    seen = {"buckets": 0, "bytes": 0, "largest": 0}

    def counted(buckets: Iterable[Any]) -> Iterable[Any]:
        for b in buckets:
            seen["buckets"] += 1
            seen["bytes"] += b.nbytes
            seen["largest"] = max(seen["largest"], b.nbytes)
            yield b

    if engine is None:
        for _ in counted(learner.iter_weight_buckets(bucket_bytes)):
            pass  # a rank without the engine: its share of the gathers, nothing sent
    elif isinstance(engine, HFEngine):
        await engine.update_weights_from_buckets(counted(learner.iter_weight_buckets(bucket_bytes)))
    elif isinstance(engine, SGLangEngine):
        address = group_address(rollout.weight_group_address, engine.live)
        group = await _sglang_group(engine, learner, address)
        buckets = counted(learner.iter_weight_buckets(bucket_bytes, device=group.device))
        await engine.update_weights_from_buckets(buckets, group.broadcast, group_name=group.name)
    elif isinstance(engine, VLLMEngine):
        address = group_address(rollout.weight_group_address, engine.live)
        device = transfer_device(learner)
        await engine.update_weights_from_buckets(
            lambda: counted(learner.iter_weight_buckets(bucket_bytes, device=device)), learner.weight_meta(),
            bucket_bytes=bucket_bytes, master_address=address, device=device)
    else:
        raise TypeError(f"rollout.weight_sync=memory: {type(engine).__name__} has no in-memory weight "
                        "update; use rollout.weight_sync=disk")
    return SyncStats(seen["buckets"], seen["bytes"], time.perf_counter() - t0, seen["largest"])


__all__ = ["GROUP_NAME", "SyncStats", "check_disk_sync", "gloo_interface", "group_address",
           "init_custom_process_group", "sync_in_memory", "transfer_device"]
