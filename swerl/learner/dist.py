"""Process-group helpers for the data-parallel learner: init from torchrun's environment, rank info,
small collectives on Python objects, and the assignment of whole rollout groups to ranks.

    with init_distributed("auto", required=True) as info:   # torchrun … or a plain `python …`
        rows = shard_rows_by_group(groups, info.rank, info.world_size, lengths=lengths)
        ...

Launched by torchrun (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set), `init_distributed`
joins the group (nccl when CUDA is available, gloo otherwise) and destroys it when the `with` block
ends. Not launched distributed, it is a no-op single process, unless `required` (DeepSpeed needs a
process group even for one rank): then it creates a one-process gloo/nccl group on a free local port.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from swerl.net import address_towards, interface_of, is_loopback

DIST_BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the data-parallel group."""

    rank: int
    """Global rank (0 … world_size − 1)."""
    world_size: int
    """Number of data-parallel processes."""
    local_rank: int
    """Rank on this node: the CUDA device index a GPU rank uses."""
    backend: str | None
    """The process group's backend (nccl or gloo); None when no group was created."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, writes shared files and exports."""
        return self.rank == 0

    @property
    def device(self) -> str:
        """The device this rank computes on: `cuda:<local_rank>` with an nccl group, else cpu."""
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"


def launched_distributed() -> bool:
    """True when torchrun (or another launcher that sets RANK and WORLD_SIZE) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_backend(backend: str) -> str:
    """`auto` → nccl when CUDA is available, else gloo; nccl without CUDA is an error."""
    if backend not in DIST_BACKENDS:
        raise ValueError(f"dist backend must be one of {DIST_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("dist backend nccl needs CUDA, and torch sees no CUDA device; use gloo (or auto) on "
                         "CPU")
    return backend


def info() -> DistInfo:
    """This process's DistInfo from the live process group (rank 0 of 1 when there is none)."""
    if tdist.is_available() and tdist.is_initialized():
        return DistInfo(rank=tdist.get_rank(), world_size=tdist.get_world_size(),
                        local_rank=int(os.environ.get("LOCAL_RANK", "0")), backend=str(tdist.get_backend()))
    return DistInfo(rank=0, world_size=1, local_rank=0, backend=None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def init_distributed(backend: str = "auto", *, required: bool = False,
                     timeout_s: float = 1800.0) -> Iterator[DistInfo]:
    """Join (or create) the process group for the `with` block; destroy it on the way out.

    `backend`: auto | nccl | gloo. `required`: create a one-process group when not launched by torchrun
    (the DeepSpeed learner needs one). An already initialised group is used as is and left alone.
    `timeout_s`: how long a collective waits for the other ranks before failing (a crashed rank
    otherwise hangs the rest forever).
    """
    if tdist.is_initialized():  # owned by someone else (e.g. an outer `with`): don't tear it down
        yield info()
        return
    if not launched_distributed() and not required:
        yield DistInfo(rank=0, world_size=1, local_rank=0, backend=None)
        return
    name = resolve_backend(backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    if launched_distributed():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if name == "nccl":
            torch.cuda.set_device(local_rank)
        _pin_gloo_interface(name)
        tdist.init_process_group(name, timeout=timeout)
        env: dict[str, str] = {}
    else:
        local_rank = 0
        if name == "nccl":
            torch.cuda.set_device(0)
        # the torchrun variables, for the block only: DeepSpeed reads LOCAL_RANK from the environment
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            tdist.init_process_group(name, timeout=timeout)
        except BaseException:
            _restore(saved)
            raise
    try:
        yield DistInfo(rank=tdist.get_rank(), world_size=tdist.get_world_size(), local_rank=local_rank,
                       backend=name)
    finally:
        tdist.destroy_process_group()
        if env:
            _restore(saved)


def _pin_gloo_interface(backend: str) -> None:
    """Ranks on several machines (MASTER_ADDR not loopback): gloo binds to the interface this machine
    reaches MASTER_ADDR from, unless GLOO_SOCKET_IFNAME is set. Gloo's own choice is the address the
    hostname resolves to, loopback on many machines, which a rank elsewhere would then be told to connect
    to. Kept for the process: DeepSpeed makes more gloo groups later."""
    master = os.environ.get("MASTER_ADDR", "")
    if backend != "gloo" or "GLOO_SOCKET_IFNAME" in os.environ or not master or is_loopback(master):
        return
    try:
        iface = interface_of(address_towards(master))
    except OSError as e:
        raise RuntimeError(f"no route from this machine to MASTER_ADDR={master} ({e}) — give torchrun "
                           "--master-addr an address every node reaches, or set GLOO_SOCKET_IFNAME") from e
    if iface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface


def _restore(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _active() -> bool:
    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """`obj` of rank `src` on every rank (picklable objects; a no-op in a single process)."""
    if not _active():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order ([obj] in a single process)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def _reduce(value: float, op: str, dtype: torch.dtype) -> float:
    if not _active():
        return value
    # nccl reduces only CUDA tensors; gloo only CPU ones
    device = f"cuda:{torch.cuda.current_device()}" if tdist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=dtype, device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM if op == "sum" else tdist.ReduceOp.MAX)
    return t.item()


def sum_over_ranks(value: float) -> float:
    """Sum of `value` over ranks (float64, so token counts stay exact)."""
    return float(_reduce(float(value), "sum", torch.float64))


def max_over_ranks(value: int) -> int:
    """Largest `value` over ranks."""
    return int(_reduce(int(value), "max", torch.int64))


@dataclass(frozen=True)
class Storage:
    """Which ranks see the same run directory: one filesystem for all (shared storage), or one per node
    (no shared filesystem). Found by `probe_storage`, never assumed."""

    leaders: tuple[int, ...]
    """Per rank, the lowest rank that sees the same directory: the one that creates and completes a
    checkpoint directory there."""

    @property
    def shared(self) -> bool:
        """Every rank sees the same directory."""
        return all(lead == 0 for lead in self.leaders)

    def leader(self, rank: int) -> int:
        return self.leaders[rank]


def probe_storage(directory: str | os.PathLike[str]) -> Storage:
    """Collective: which ranks see the same `directory` (created if missing). Every rank leaves a marker
    file named by a nonce of rank 0's and its rank, then lists whose markers it sees; the markers are
    removed. Raises RuntimeError when the answers do not form groups (one rank sees another that does
    not see it back), or when ranks of several nodes share a directory while others do not (each
    node's local rank 0 then writes the node's checkpoint files, and two of them would write the same
    file): use one filesystem for all, or one per node."""
    if not _active():
        return Storage((0,))
    import secrets

    nonce = broadcast_object(secrets.token_hex(8))
    root = os.fspath(directory)
    os.makedirs(root, exist_ok=True)
    rank = tdist.get_rank()
    mark = os.path.join(root, f".swerl-probe-{nonce}-{rank}")
    with open(mark, "w"):
        pass
    barrier()
    prefix = f".swerl-probe-{nonce}-"
    seen = sorted(int(n[len(prefix):]) for n in os.listdir(root) if n.startswith(prefix))
    barrier()
    os.unlink(mark)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    every = all_gather_object((seen, local_rank))
    leaders = tuple(min(group) for group, _ in every)
    for r, (group, _) in enumerate(every):
        if any(every[o][0] != group for o in group):
            raise RuntimeError(f"ranks disagree on who shares {root} (rank {r} sees ranks {group}) — give "
                               "every node the same kind of run directory: one shared filesystem, or one "
                               "local directory per node")
    storage = Storage(leaders)
    if not storage.shared:
        for lead in set(leaders):
            firsts = [r for r, (_, lr) in enumerate(every) if leaders[r] == lead and lr == 0]
            if len(firsts) > 1:
                raise RuntimeError(f"ranks {firsts} are local rank 0 of different nodes that share {root} "
                                   "while other ranks do not — use one shared filesystem for every node, or "
                                   "a local run directory on each")
    return storage


def share_directory(path: str | os.PathLike[str], storage: Storage) -> None:
    """Collective: rank 0's directory `path` (small: a generated model, a config) written at the same path
    on every node that does not see rank 0's run directory (`storage`), atomically; a no-op on shared
    storage. Large inputs (a real model) must be on every node already."""
    if storage.shared:
        return
    files = None
    if tdist.get_rank() == 0:
        root = os.fspath(path)
        files = {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()  # noqa: SIM115
                 for d, _, names in os.walk(root) for n in names}
    files = broadcast_object(files)
    rank = tdist.get_rank()
    if storage.leader(rank) == rank and storage.leader(0) != rank:
        import shutil
        import tempfile

        final = os.path.abspath(os.fspath(path))
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(final))
        for rel, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)  # a copy from an earlier start of the run
        os.rename(tmp, final)  # atomic: the directory is whole or absent
    barrier()


def shard_rows_by_group(groups: Sequence[int], rank: int, world_size: int, *,
                        lengths: Sequence[int] | None = None) -> list[int]:
    """Row indices (ascending) that rank `rank` trains on: whole rollout groups, balanced over ranks.

    Group advantages, AEM's per-group normalisation and DAPO's filter all need every member of a
    group on the same rank, so groups are never split. Balance is by token count when `lengths` (one
    per row) is given, else by row count: groups are dealt largest first to the least loaded rank
    (ties: the first-seen group, the lower rank), which is deterministic, so every rank computes the
    same assignment from the same inputs without communicating.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    if lengths is not None and len(lengths) != len(groups):
        raise ValueError(f"shard_rows_by_group: {len(groups)} group labels but {len(lengths)} lengths")
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(int(g), []).append(i)
    if len(members) < world_size:
        raise ValueError(f"{len(members)} rollout groups cannot be spread over {world_size} ranks: every "
                         "rank needs at least one whole group; train with more groups per batch or fewer "
                         "processes")
    weight = {g: sum(int(lengths[i]) for i in rows) if lengths is not None else len(rows)
              for g, rows in members.items()}
    order = sorted(members, key=lambda g: -weight[g])  # stable: first-seen wins ties
    load = [0] * world_size
    count = [0] * world_size
    mine: list[int] = []
    for g in order:
        # an empty rank first (every rank must get a group), then the least loaded one
        r = min(range(world_size), key=lambda k: (count[k] > 0, load[k], k))
        load[r] += weight[g]
        count[r] += 1
        if r == rank:
            mine.extend(members[g])
    return sorted(mine)
