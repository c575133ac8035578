"""scripts/experiment_credit.py: the arms' runs from one warm start, and the summary it reports (curves
over seeds, peak-to-final drop, the energy–reward-variance correlation pooled over steps and seeds)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import experiment_credit as ec  # noqa: E402

NAN = float("nan")


def _write_run(d: Path, rows: list[dict]) -> None:
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(step, success, val=None, entropy=1.0, share=0.1, act=(), rea=(), var=()):
    r = {"train_step": step, "reward/success_rate": success, "actor/entropy": entropy,
         "actfocus/action_token_share": share, "actfocus/group_energy_action": list(act),
         "actfocus/group_energy_reasoning": list(rea), "actfocus/group_reward_var": list(var)}
    if val is not None:
        r["val/success_rate"] = val
    return r


def test_an_arm_is_summarised_over_its_seeds(tmp_path):
    cfg = ec.ExperimentConfig(out=str(tmp_path), envs=("frozenlake",), data=("",), arms=("uniform",),
                              seeds=(0, 1), steps=4, eval_every=2)
    _write_run(ec.run_dir(cfg, "frozenlake", "uniform", 0), [
        _row(1, 0.25, entropy=2.0, act=(1.0, 2.0), rea=(5.0, 5.5), var=(0.0, 0.25)),
        _row(2, 0.50, val=0.6, entropy=1.5, act=(3.0, NAN), rea=(4.0, 6.0), var=(0.5, 0.1)),
        _row(3, 0.75, share=0.3, act=(4.0,), rea=(5.0,), var=(1.0,)),
        _row(4, 0.25, val=0.3, act=(), rea=(), var=())])
    _write_run(ec.run_dir(cfg, "frozenlake", "uniform", 1), [
        _row(1, 0.0, entropy=1.0, act=(2.0,), rea=(7.0,), var=(0.2,)),
        _row(2, 0.25, val=0.4), _row(3, 0.5), _row(4, 1.0, val=0.5)])
    s = ec.summarise_arm(cfg, "frozenlake", "uniform", {"heldout_success": 0.5})
    assert s["seeds"] == 2
    # held-out: step 0 is the warm start (0.5) in both seeds; seed 0 0.5 → 0.6 → 0.3, seed 1 0.5 → 0.4 → 0.5
    h = s["heldout_success"]
    assert h["step"] == [0, 2, 4] and h["mean"] == pytest.approx([0.5, 0.5, 0.4])
    assert h["min"] == pytest.approx([0.5, 0.4, 0.3]) and h["max"] == pytest.approx([0.5, 0.6, 0.5])
    # peak-to-final: seed 0 0.6 - 0.3 = 0.3, seed 1 0.5 - 0.5 = 0; final 0.3 and 0.5
    assert s["peak_to_final_drop"]["mean"] == pytest.approx(0.15)
    assert s["peak_to_final_drop"]["sd"] == pytest.approx(math.sqrt(2 * 0.15 ** 2))
    assert s["final_heldout"]["mean"] == pytest.approx(0.4)
    assert s["best_heldout"]["mean"] == pytest.approx(0.55)
    # train success of the last 3 steps: seed 0 (0.5 + 0.75 + 0.25) / 3, seed 1 (0.25 + 0.5 + 1) / 3
    assert s["final_train_success"]["mean"] == pytest.approx((1.5 / 3 + 1.75 / 3) / 2)
    assert s["train_success"]["mean"] == pytest.approx([0.125, 0.375, 0.625, 0.625])
    assert s["entropy"]["step"] == [1, 2, 3, 4] and s["entropy"]["mean"][0] == pytest.approx(1.5)
    # the correlation pools every group of every step and seed (NaN groups dropped): independently by
    # numpy in float64 over the finite pairs
    x = np.array([1.0, 2.0, 3.0, 4.0, 2.0])
    y = np.array([0.0, 0.25, 0.5, 1.0, 0.2])
    act = s["energy_reward_corr"]["action"]
    assert act["groups"] == 5 and act["pearson"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    z, h95 = math.atanh(act["pearson"]), 1.959963984540054 / math.sqrt(5 - 3)
    assert act["ci95"] == pytest.approx([math.tanh(z - h95), math.tanh(z + h95)], abs=1e-12)
    xr = np.array([5.0, 5.5, 4.0, 6.0, 5.0, 7.0])
    yr = np.array([0.0, 0.25, 0.5, 0.1, 1.0, 0.2])
    rea = s["energy_reward_corr"]["reasoning"]
    assert rea["groups"] == 6 and rea["pearson"] == pytest.approx(np.corrcoef(xr, yr)[0, 1], abs=1e-12)
    assert s["action_token_share"]["mean"] == pytest.approx((0.1 * 7 + 0.3) / 8)
    md = ec.table({"envs": {"frozenlake": {"arms": {"uniform": s}}}})
    # entropy over seeds: step 1 (2.0 + 1.0) / 2, step 4 (1.0 + 1.0) / 2
    assert ("| frozenlake | uniform | 40.0 ± 14.1 | 55.0 ± 7.1 | 15.0 ± 21.2 | 54.2 ± 5.9 | 1.500 → 1.000 |"
            in md)


def test_each_arm_sets_its_switches_and_shares_everything_else(tmp_path):
    cfg = ec.ExperimentConfig(out=str(tmp_path))
    configs = {a: ec.train_config(cfg, "sokoban", "dim=5", a, 1, tmp_path / "warm") for a in ec.ARMS}
    on = {a: (c["algo"]["actfocus"]["enabled"], c["algo"]["aem"]["enabled"]) for a, c in configs.items()}
    assert on == {"uniform": (False, False), "actfocus": (True, False), "aem": (False, True),
                  "both": (True, True)}
    # the frozen reference's energy is measured in every arm, so the diagnostic compares on all four
    assert all(c["algo"]["actfocus"].get("measure") or c["algo"]["actfocus"]["enabled"]
               for c in configs.values())
    strip = [{k: v for k, v in c.items() if k not in ("algo", "run_dir")} for c in configs.values()]
    assert all(s == strip[0] for s in strip)
    assert strip[0]["model"]["path"] == str(tmp_path / "warm") and strip[0]["seed"] == 1
    # every generated config is one `swerl train` accepts
    from swerl.config import load
    from swerl.train import TrainConfig

    for c in configs.values():
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps(c))
        assert load(TrainConfig, path).env.kind == "sokoban"


def test_model_sizes_not_given_keep_the_tiny_defaults(tmp_path):
    cfg = ec.load_config(None, ["model.hidden_size=64"])
    assert cfg.model.hidden_size == 64 and cfg.model.num_heads == ec.TINY["num_heads"] == 2
    assert cfg.model.intermediate_size == 512
    path = tmp_path / "gpu.yaml"
    path.write_text("model: {path: /models/qwen, num_layers: 3}\n")
    cfg = ec.load_config(str(path), [])
    assert (cfg.model.path, cfg.model.num_layers, cfg.model.hidden_size) == ("/models/qwen", 3, 128)
    for name in ("credit_gpu.yaml", "credit_smollm2_gpu.yaml"):
        assert ec.load_config(str(ROOT / "configs" / "experiment" / name), []).engine == "sglang"


def test_the_real_model_config_reaches_sft_and_train(tmp_path, monkeypatch):
    # the real model's size: its batch knobs reach both commands, every generated config is accepted
    path = ROOT / "configs" / "experiment" / "credit_smollm2_cpu.yaml"
    cfg = ec.load_config(str(path), [f"out={tmp_path}"])
    assert cfg.model.path == "smollm2-135m-instruct" and not cfg.compact_vocab
    c = ec.train_config(cfg, "frozenlake", "size=3", "both", 2, tmp_path / "warm")
    assert c["optim"]["micro_batch_tokens"] == cfg.micro_batch_tokens == 1536
    assert c["env"]["frozenlake"]["data"] == "size=3"
    from swerl.config import load
    from swerl.sft import SFTConfig
    from swerl.train import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(c))
    assert load(TrainConfig, path).optim.micro_batch_tokens == 1536
    # its runs batch continuously (the overrides every `swerl train` of it gets)
    assert load(TrainConfig, path, list(cfg.train_overrides)).rollout.hf.continuous is True
    # the warm start's config as the script writes it (sft itself not run: the stand-in raises first)
    def stop(cmd, log, env):
        raise RuntimeError("stop")

    monkeypatch.setattr(ec, "_run", stop)
    with pytest.raises(RuntimeError, match="stop"):
        ec.warm_start(cfg, "frozenlake", "size=3")
    sft = load(SFTConfig, tmp_path / "frozenlake" / "warm" / "sft.yaml")
    assert (sft.batch_size, sft.model.path, sft.data) == (4, "smollm2-135m-instruct", "size=3")
    assert not sft.compact_vocab


def test_bad_input_is_one_clear_line():
    r = subprocess.run([sys.executable, "scripts/experiment_credit.py", "arms=[uniform,magic]"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "magic" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_small_experiment_runs_end_to_end_and_resumes(tmp_path):
    args = [sys.executable, "scripts/experiment_credit.py", f"out={tmp_path}", "envs=[frozenlake]",
            'data=[""]', "arms=[uniform,both]", "seeds=[0]", "steps=1", "eval_every=1", "sft_games=8",
            "sft_epochs=1", "eval_games=2", "group_size=2", "tasks_per_step=2", "max_new_tokens=48",
            "max_turns=3", "model.hidden_size=32", "model.num_heads=1", "model.intermediate_size=64",
            'bench_out=""']
    # --warm-start-only: the warm start and no arm; the full run below reuses it
    r = subprocess.run([*args, "--warm-start-only"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    assert "frozenlake: warm start held-out success" in r.stdout
    assert sorted(p.name for p in (tmp_path / "frozenlake").iterdir()) == ["warm"]
    assert not (tmp_path / "experiment_credit.json").exists()
    warm = {p: p.stat().st_mtime_ns for p in (tmp_path / "frozenlake" / "warm").rglob("*") if p.is_file()}
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    assert {p: p.stat().st_mtime_ns for p in warm} == warm  # the warm start reused, not trained again
    out = json.loads((tmp_path / "experiment_credit.json").read_text())
    arms = out["envs"]["frozenlake"]["arms"]
    assert set(arms) == {"uniform", "both"} and all(a["seeds"] == 1 for a in arms.values())
    assert arms["both"]["heldout_success"]["step"] == [0, 1]
    assert (tmp_path / "experiment_credit.png").stat().st_size > 10_000
    assert "| frozenlake | both |" in r.stdout
    # the warm start is a compact-vocabulary model the runs started from
    assert (tmp_path / "frozenlake" / "warm" / "model" / "swerl_compact_vocab.json").is_file()
    # run again: nothing is retrained (the runs' logs do not grow), the summary is rewritten
    logs = {p: p.stat().st_size for p in tmp_path.rglob("*.log")}
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and {p: p.stat().st_size for p in tmp_path.rglob("*.log")} == logs
    # with other train overrides into the same out: refused in one line, not mixed into the table
    r = subprocess.run([*args, "train_overrides=[rollout.hf.continuous=true]"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 1 and "another config or train_overrides" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1
    assert {p: p.stat().st_size for p in tmp_path.rglob("*.log")} == logs


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["warm start", "runs"])
def test_sigterm_stops_the_runs_and_leaves_no_process(tmp_path, phase):
    """SIGTERM to the experiment alone (`kill PID`, not its process group) stops whatever it runs: the
    warm start's `swerl sft` (which it waits on itself) or the runs (which its workers wait on)."""
    import os
    import signal
    import time

    def children(word: str = "") -> list[int]:  # processes whose command line names this experiment's dir
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = (Path("/proc") / pid / "cmdline").read_bytes()
            except OSError:
                continue
            if str(tmp_path).encode() in cmd and word.encode() in cmd and int(pid) != proc.pid:
                out.append(int(pid))
        return out

    warm = phase == "warm start"
    args = [sys.executable, "scripts/experiment_credit.py", f"out={tmp_path}", "envs=[frozenlake]",
            'data=[""]', "arms=[uniform,both]", "seeds=[0,1]", "steps=50",
            f"sft_games={400 if warm else 8}", "sft_epochs=1",
            "eval_games=2", "group_size=2", "tasks_per_step=2", "max_new_tokens=48", "max_turns=3",
            "model.hidden_size=32", "model.num_heads=1", "model.intermediate_size=64", 'bench_out=""']
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not (children("sft") if warm else list(tmp_path.glob("frozenlake/*/seed*.log")) and children()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert children() == []
    if warm:  # no run started
        assert not list(tmp_path.glob("frozenlake/*/seed*.log"))
    else:  # the runs of the later seed never started
        assert not list(tmp_path.glob("frozenlake/*/seed1.log"))
