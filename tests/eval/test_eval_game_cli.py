"""`swerl eval game` in process with the hf engine: `--continuous` reaches the engine it opens and the
episodes run through it; with a server engine the flag is one line of error."""

from __future__ import annotations

import json

import pytest

import swerl.eval.model as eval_model
from swerl.cli import main
from swerl.models import make_tiny_qwen


@pytest.mark.slow
def test_continuous_reaches_the_hf_engine_and_every_sample_runs(tmp_path, monkeypatch, capsys):
    opened = []
    real = eval_model.open_engine

    async def recording(cfg, *a, **kw):
        opened.append(cfg)
        return await real(cfg, *a, **kw)

    monkeypatch.setattr(eval_model, "open_engine", recording)
    model = make_tiny_qwen(tmp_path / "tiny")
    out = tmp_path / "eval"
    base = ["eval", "game", "frozenlake", "--model", str(model), "--in-process", "--game-data", "size=3",
            "--k", "4", "--limit", "2", "--max-steps", "2", "--max-new-tokens", "16", "--seed", "0",
            "--quiet"]
    assert main([*base, "--continuous", "--out", str(out)]) == 0
    assert [c.continuous for c in opened] == [True]
    rep = json.loads((out / "report.json").read_text())
    assert rep["episodes"] == 8 and rep["sample_errors"] == 0
    assert len(list((out / "trajectories").glob("*.json"))) == 8
    # without the flag: static batches, as training's default
    assert main([*base, "--out", str(tmp_path / "static")]) == 0
    assert [c.continuous for c in opened] == [True, False]


def test_continuous_with_a_server_engine_is_one_line(tmp_path, capsys):
    code = main(["eval", "game", "frozenlake", "--model", str(tmp_path), "--in-process", "--engine", "vllm",
                 "--continuous", "--limit", "1", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "--continuous goes with --engine hf" in err


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_config_refuses_continuous_for_servers(engine):
    with pytest.raises(ValueError, match="--continuous goes with --engine hf"):
        eval_model.engine_config(engine, continuous=True)
    assert eval_model.engine_config("hf", seed=1, continuous=True).continuous is True
