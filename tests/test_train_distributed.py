"""`swerl train` under torchrun (and the deepspeed launcher) with the DeepSpeed learner (2 CPU processes
over gloo): rank 0 samples the episodes, each rank trains on whole rollout groups, and the first update
equals the single-process run's on the same episodes; on two nodes with no shared filesystem the run
checkpoints per node and resumes. Under
ZeRO-3 the loop hands the learner a model factory and the policy and reference are built partitioned:
the same first update."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMMON = ["--config", str(ROOT / "configs/toy_cpu.yaml"), "batch_episodes=32", "export_final=true",
          "checkpoint_every=2", "algo.aem.enabled=true", "algo.actfocus.enabled=true",
          "metrics.progress=false"]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _torchrun(run_dir: Path, stage: int) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "swerl.cli", "train",
            *COMMON, f"run_dir={run_dir}", "learner.backend=deepspeed", f"learner.zero_stage={stage}"]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> list[dict]:
    """The single-process run's metrics rows (2 steps)."""
    run_dir = tmp_path_factory.mktemp("single")
    _run([str(BIN / "swerl"), "train", *COMMON, f"run_dir={run_dir}", "steps=2"])
    return _rows(run_dir)


def _assert_same_first_update(a: dict, b: dict) -> None:
    # step 1: the same episodes (rank 0's engine, same seed and weights) → the same update
    assert b["reward/mean"] == a["reward/mean"] and b["actor/episodes"] == a["actor/episodes"] == 32
    assert b["actor/tokens"] == a["actor/tokens"]
    for key in ("actor/loss", "actor/grad_norm", "actor/entropy", "aem/alpha_max", "actfocus/weight_action"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def _two_nodes(node, port: int, rank: int, steps: int) -> list[str]:
    """Node `rank`'s torchrun of a two-node run: one rank per node, static rendezvous at node 0's address
    on the link (never loopback); the run directory relative to the node's working directory."""
    cmd = [str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
           "--master-addr", node.peer, "--master-port", str(port), "-m", "swerl.cli", "train", *COMMON,
           "run_dir=run", "learner.backend=deepspeed", "learner.zero_stage=2", f"steps={steps}"]
    return node.command(cmd) if rank == 1 else cmd


def _run_two_nodes(node, port: int, dirs: tuple[Path, Path], steps: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("GLOO_SOCKET_IFNAME", None)
    procs = [subprocess.Popen(_two_nodes(node, port, r, steps), cwd=dirs[r], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (1, 0)]
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"{' '.join(p.args)} failed:\n{out[-6000:]}"


@pytest.mark.slow
def test_two_nodes_without_shared_storage_match_single_process_and_resume(tmp_path, single):
    """Learner ranks on two nodes, as a multi-node torchrun places them: node 1 runs in a network namespace
    of its own (`netns_node`: it reaches node 0 over a link only; this machine's hostname resolves to
    loopback, so gloo's own choice of interface would fail) and in another working directory, so the
    relative run_dir is a directory of its own (no shared filesystem). The first update equals the
    single process's; each node's checkpoint holds its own rank's shard and DeepSpeed's node-wide files;
    the run resumes on both nodes from their own disks."""
    from swerl.cluster.onebox import netns_node
    from swerl.learner.ds_learner import DS_TAG
    from swerl.rollout.http import free_port

    dirs = (tmp_path / "node0", tmp_path / "node1")
    for d in dirs:
        d.mkdir()
    with netns_node("swerl-t-n1") as node:
        port = free_port(node.peer)
        _run_two_nodes(node, port, dirs, steps=2)
        rows = _rows(dirs[0] / "run")
        assert [r["train_step"] for r in rows] == [1, 2]  # written by rank 0 only, on node 0
        assert not (dirs[1] / "run" / "metrics.jsonl").exists()
        _assert_same_first_update(single[0], rows[0])
        for rank, d in enumerate(dirs):
            ckpt = d / "run" / "checkpoints" / "step_00000002"
            shards = sorted(p.name for p in ckpt.glob("learner_rank*.pt"))
            assert shards == [f"learner_rank{rank:05d}.pt"], (d, shards)  # its own shard, on its own disk
            assert (ckpt / "state.pt").is_file() and (ckpt / DS_TAG / "mp_rank_00_model_states.pt").is_file()
            assert not list((d / "run" / "checkpoints").glob(".tmp-*"))
        _run_two_nodes(node, port, dirs, steps=3)  # resume from step 2, each node from its own checkpoint
    assert [r["train_step"] for r in _rows(dirs[0] / "run")] == [1, 2, 3]
    assert (dirs[1] / "run" / "checkpoints" / "step_00000003" / "learner_rank00001.pt").is_file()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(dirs[0] / "run" / "policy")  # exported by rank 0 on node 0


@pytest.mark.slow
def test_torchrun_zero3_train_builds_partitioned_and_matches_single_process(tmp_path, single):
    z3 = tmp_path / "z3"
    _run([*_torchrun(z3, 3), "steps=1"])
    (row,) = _rows(z3)
    # the same loss, entropy and gradient norm: the partitioned policy and reference started from
    # exactly the weights the single process built (and rank 0's engine sampled with)
    _assert_same_first_update(single[0], row)


@pytest.mark.slow
def test_deepspeed_launcher_train_matches_single_process(tmp_path, single):
    """The `deepspeed` launcher passes --local_rank=N before the subcommand; the CLI takes it and the
    run is the same as torchrun's."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ds = tmp_path / "ds"
    _run([str(BIN / "deepspeed"), "--num_gpus", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
          "--module", "swerl.cli", "train", *COMMON, f"run_dir={ds}", "learner.backend=deepspeed",
          "learner.zero_stage=1", "steps=1"])
    (row,) = _rows(ds)
    _assert_same_first_update(single[0], row)
    assert (ds / "checkpoints").is_dir() and (ds / "policy").is_dir()
