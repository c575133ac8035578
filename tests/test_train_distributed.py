"""`swerl train` under torchrun with the DeepSpeed learner (2 CPU processes over gloo): rank 0 samples
the episodes, each rank trains on whole rollout groups, and the first update equals the single-process
run's on the same episodes; the run checkpoints per rank and resumes."""

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


@pytest.mark.slow
def test_torchrun_deepspeed_train_matches_single_process_and_resumes(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    _run([str(BIN / "swerl"), "train", *COMMON, f"run_dir={single}", "steps=2"])
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "swerl.cli", "train", *COMMON,
                f"run_dir={multi}", "learner.backend=deepspeed", "learner.zero_stage=2"]
    _run([*torchrun, "steps=2"])
    a, b = _rows(single), _rows(multi)
    assert [r["train_step"] for r in b] == [1, 2]  # one row per step, written by rank 0 only
    # step 1: the same episodes (rank 0's engine, same seed and weights) → the same update
    assert b[0]["reward_mean"] == a[0]["reward_mean"] and b[0]["episodes"] == a[0]["episodes"] == 32
    assert b[0]["tokens"] == a[0]["tokens"]
    for key in ("loss", "grad_norm", "entropy", "aem_alpha_max", "actfocus_weight_action"):
        assert b[0][key] == pytest.approx(a[0][key], rel=1e-4, abs=1e-6), key
    ckpt = multi / "checkpoints" / "step_00000002"
    assert ckpt.is_dir() and len(list(ckpt.glob("learner_rank*.pt"))) == 2  # one shard per rank
    # resume from the step-2 checkpoint for one more step
    _run([*torchrun, "steps=3"])
    assert [r["train_step"] for r in _rows(multi)] == [1, 2, 3]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(multi / "policy")  # exported by rank 0 from the gathered weights
