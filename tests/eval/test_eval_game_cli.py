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


def test_every_worker_has_a_generate_call_in_flight_and_engine_python_launches_the_server(tmp_path,
                                                                                           monkeypatch):
    """--workers 40 against a server: 40 generate calls at once (the episode runner's default cap is 32),
    the server client sized for them, and the server launched with --engine-python's interpreter."""
    import asyncio

    from swerl.agent import load_tokenizer
    from swerl.structs import Generation

    model = make_tiny_qwen(tmp_path / "tiny")
    tok = load_tokenizer(str(model))
    opened = {}

    class Gated:  # holds each call until all workers have one in flight (5 s at most): a cap lowers the peak
        in_flight = peak = 0

        async def generate(self, prompt_ids, params):
            Gated.in_flight += 1
            Gated.peak = max(Gated.peak, Gated.in_flight)
            for _ in range(500):
                if Gated.in_flight >= 40:
                    break
                await asyncio.sleep(0.01)
            Gated.in_flight -= 1
            ids = (*tok("I am not sure.", add_special_tokens=False)["input_ids"], tok.eos_token_id)
            return Generation(token_ids=ids, logprobs=(0.0,) * len(ids), finish_reason="stop")

        async def close(self):
            return None

    async def fake_open(cfg, path, *, concurrency, log_dir=None, on_wait=None):
        opened.update(cfg=cfg, concurrency=concurrency)
        return Gated()

    monkeypatch.setattr(eval_model, "open_engine", fake_open)
    out = tmp_path / "eval"
    assert main(["eval", "game", "frozenlake", "--model", str(model), "--in-process", "--game-data", "size=3",
                 "--engine", "vllm", "--engine-python", "/opt/vllm/bin/python", "--k", "8", "--limit", "5",
                 "--max-steps", "1", "--workers", "40", "--out", str(out), "--quiet"]) == 0
    assert opened["cfg"].python == "/opt/vllm/bin/python" and opened["concurrency"] == 40
    assert Gated.peak == 40
    assert json.loads((out / "report.json").read_text())["episodes"] == 40


@pytest.mark.parametrize(("engine", "url", "message"), [
    ("hf", None, "--engine-python goes with --engine vllm or sglang"),
    ("vllm", "http://a:1", "with --engine-url nothing is launched"),
    ("sglang", "http://a:1", "with --engine-url nothing is launched")])
def test_engine_python_where_nothing_is_launched_is_refused(engine, url, message):
    with pytest.raises(ValueError, match=message):
        eval_model.engine_config(engine, engine_url=url, python=".venv-vllm/bin/python")
    assert eval_model.engine_config("sglang", python="/x/python").python == "/x/python"
