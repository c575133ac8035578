"""Ranks on several nodes, with or without a shared filesystem (`swerl.learner.dist.probe_storage`,
`share_directory`, `swerl.learner.checkpoint.agreed_checkpoint`): two gloo ranks in spawned processes,
each given the same run directory (one filesystem) or one of its own (a node's local disk)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def _rank(rank: int, port: int, dirs: list[str], out: str) -> None:
    import json

    import torch.distributed as tdist

    from swerl.learner import dist
    from swerl.learner.checkpoint import agreed_checkpoint, atomic_dir

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        run_dir = Path(dirs[rank])
        storage = dist.probe_storage(run_dir)
        model = run_dir / "init_model"
        if rank == 0:  # what rank 0 alone generates (a tiny model)
            with atomic_dir(model) as tmp:
                (tmp / "config.json").write_text('{"n": 1}')
                (tmp / "sub").mkdir()
                (tmp / "sub" / "w.bin").write_bytes(bytes(range(256)))
        dist.barrier()
        dist.share_directory(model, storage)
        seen = {str(p.relative_to(model)): p.read_bytes().hex()
                for p in sorted(model.rglob("*")) if p.is_file()}
        # checkpoints each node holds: step 3 is only on rank 0's disk (node 1 lost it)
        steps = (1, 2, 3) if rank == 0 else (1, 2)
        for s in steps if storage.leader(rank) == rank else ():
            d = run_dir / "checkpoints" / f"step_{s:08d}"
            d.mkdir(parents=True)
            (d / "state.pt").write_bytes(b"x")
        dist.barrier()
        agreed = agreed_checkpoint(run_dir)
        left = sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".swerl-probe"))
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"leaders": storage.leaders, "shared": storage.shared, "files": seen,
             "agreed": agreed.name if agreed else None, "probes_left": left}))
    finally:
        tdist.destroy_process_group()


def _two_ranks(tmp_path: Path, dirs: list[Path]) -> list[dict]:
    import json

    from swerl.rollout.http import free_port

    mp.spawn(_rank, args=(free_port(), [str(d) for d in dirs], str(tmp_path)), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


WANT_FILES = {"config.json": b'{"n": 1}'.hex(), "sub/w.bin": bytes(range(256)).hex()}


def test_ranks_on_one_filesystem_share_everything(tmp_path):
    a, b = _two_ranks(tmp_path, [tmp_path / "run", tmp_path / "run"])
    assert a["leaders"] == b["leaders"] == [0, 0] and a["shared"] and b["shared"]
    assert a["files"] == b["files"] == WANT_FILES
    # one disk: both ranks see step 3
    assert a["agreed"] == b["agreed"] == "step_00000003"
    assert a["probes_left"] == b["probes_left"] == []


def test_ranks_with_a_disk_each_copy_rank0s_directory_and_agree_on_a_checkpoint_both_hold(tmp_path):
    a, b = _two_ranks(tmp_path, [tmp_path / "node0" / "run", tmp_path / "node1" / "run"])
    assert a["leaders"] == b["leaders"] == [0, 1] and not a["shared"]
    assert b["files"] == WANT_FILES  # rank 0's generated directory, written on node 1's disk
    assert (tmp_path / "node1" / "run" / "init_model" / "sub" / "w.bin").read_bytes() == bytes(range(256))
    # step 3 is on node 0 only: both resume from step 2, the newest both hold
    assert a["agreed"] == b["agreed"] == "step_00000002"
    assert a["probes_left"] == b["probes_left"] == []


def test_one_process_is_its_own_storage(tmp_path):
    from swerl.learner import dist

    s = dist.probe_storage(tmp_path / "run")
    assert s.leaders == (0,) and s.shared
    dist.share_directory(tmp_path / "nothing", s)  # shared: nothing to copy, nothing read
    assert not (tmp_path / "nothing").exists()


def test_gloo_is_pinned_to_the_interface_that_reaches_the_master(monkeypatch):
    """MASTER_ADDR on another machine: gloo binds to the interface holding the address this machine
    reaches it from (not the hostname's, loopback here); loopback masters and a set GLOO_SOCKET_IFNAME
    are left alone."""
    from swerl.learner.dist import _pin_gloo_interface
    from swerl.net import address_towards, interface_of

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    _pin_gloo_interface("gloo")
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    target = "192.0.2.77"  # TEST-NET-1: routed by the default route, never answered
    try:
        own = address_towards(target)
    except OSError:
        pytest.skip("this machine has no route off loopback")
    monkeypatch.setenv("MASTER_ADDR", target)
    _pin_gloo_interface("nccl")
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    _pin_gloo_interface("gloo")
    assert os.environ["GLOO_SOCKET_IFNAME"] == interface_of(own) != "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine0")
    _pin_gloo_interface("gloo")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"
