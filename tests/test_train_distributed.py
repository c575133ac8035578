"""`swerl train` under torchrun (and the deepspeed launcher) with the DeepSpeed learner (2 CPU processes
over gloo): rank 0 samples the episodes, each rank trains on whole rollout groups, and the first update
equals the single-process run's on the same episodes; the run checkpoints per rank and resumes. Under
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
COMMON = ["--config", "configs/toy_cpu.yaml", "batch_episodes=32", "export_final=true", "checkpoint_every=2",
          "algo.aem.enabled=true", "algo.actfocus.enabled=true", "metrics.progress=false"]


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


@pytest.mark.slow
def test_torchrun_deepspeed_train_matches_single_process_and_resumes(tmp_path, single):
    multi = tmp_path / "multi"
    torchrun = _torchrun(multi, 2)
    _run([*torchrun, "steps=2"])
    b = _rows(multi)
    assert [r["train_step"] for r in b] == [1, 2]  # one row per step, written by rank 0 only
    _assert_same_first_update(single[0], b[0])
    ckpt = multi / "checkpoints" / "step_00000002"
    assert ckpt.is_dir() and len(list(ckpt.glob("learner_rank*.pt"))) == 2  # one shard per rank
    # resume from the step-2 checkpoint for one more step
    _run([*torchrun, "steps=3"])
    assert [r["train_step"] for r in _rows(multi)] == [1, 2, 3]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(multi / "policy")  # exported by rank 0 from the gathered weights


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
