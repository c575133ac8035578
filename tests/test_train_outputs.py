"""What a training run shows its user besides metrics.jsonl: the live progress line and W&B logging."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from swerl.config import load
from swerl.rollout.runner import RunSummary
from swerl.runlog import TrainDisplay
from swerl.train import TrainConfig, train


def test_progress_line_shows_step_phase_episodes_and_eta():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200)
    with TrainDisplay(10, 2, enabled=True, log=None, console=console) as ui:
        ui.phase("rollout")
        ui.episodes(RunSummary(total=16, done=5, running=3, failed=1))
        assert ui._fields["episodes"] == "episodes 5/16 (3 in flight, failed 1)"
        ui.step_done(3, "step 3/10 reward 0.500", "reward 0.500")
        task = ui._progress.tasks[0]
        assert task.completed == 3 and task.total == 10 and task.fields["last"] == "reward 0.500"
        ui.phase("learn")
        assert task.fields["phase"] == "learn"
    assert "step 3/10 reward 0.500" in buf.getvalue()


def test_without_a_terminal_the_lines_go_to_the_log():
    lines: list[str] = []
    with TrainDisplay(4, enabled=True, log=lines.append) as ui:  # pytest's stderr is not a terminal
        assert not ui.enabled
        ui.step_done(1, "step 1/4 reward 0.250", "x")
    assert lines == ["step 1/4 reward 0.250"]


@pytest.mark.slow
def test_wandb_offline_run_records_the_metrics(tmp_path):
    cfg = load(TrainConfig, "configs/toy_cpu.yaml", [f"run_dir={tmp_path}", "steps=2", "batch_episodes=16",
                                                      "export_final=false", "metrics.wandb=true",
                                                      "metrics.wandb_mode=offline"])
    rows = train(cfg, log=None)
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    # the offline run's record file (protobuf history records: key and JSON value as strings)
    data = next(runs[0].glob("*.wandb")).read_bytes()
    assert data.count(b"reward/mean") >= len(rows) == 2
    assert b"aem/alpha_mean" in data and b"reward/success_rate" in data
    # resumed in the same process (W&B's service was shut down when the first run ended): the same run id
    cfg = load(TrainConfig, "configs/toy_cpu.yaml", [f"run_dir={tmp_path}", "steps=3", "batch_episodes=16",
                                                      "export_final=false", "metrics.wandb=true",
                                                      "metrics.wandb_mode=offline"])
    train(cfg, log=None)
    assert (tmp_path / "wandb_run_id").read_text().strip() == run_id
    records = [f.read_bytes() for f in (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/*.wandb")]
    assert sum(r.count(b"reward/mean") for r in records) >= 3
