"""`swerl sft`: expert demonstrations in RL's own token-exact format, with reasoning before each
action; a loss on the generated tokens only; a saved model that evaluates as it was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swerl.models import ModelConfig
from swerl.sft import SFTConfig, demonstrations, narrate, sft_loss, token_share
from swerl.structs import Trajectory

ROOT = Path(__file__).resolve().parents[1]


def _traj(ids, mask, span=None):
    n = len(ids)
    return Trajectory(tuple(ids), tuple(mask), tuple(span or mask), (0.0,) * n, (-1,) * n, 1, True, False,
                      "won")


def test_the_loss_is_the_cross_entropy_of_the_generated_tokens_only():
    from transformers import AutoModelForCausalLM

    from swerl.models import make_tiny_qwen

    model = AutoModelForCausalLM.from_pretrained(make_tiny_qwen(ROOT / ".cache" / "test-sft-tiny"),
                                                 dtype="float32")
    batch = [_traj([5, 6, 7, 8, 9], [0, 0, 1, 1, 0]), _traj([10, 11, 12], [0, 1, 1])]
    got = sft_loss(model, batch, max_len=100)
    # independently: full logits of each sequence alone (no padding), float64 log-softmax, the mean of
    # -log p(token | prefix) over the four masked tokens
    terms = []
    with torch.no_grad():
        for t in batch:
            logits = model(input_ids=torch.tensor([t.token_ids])).logits[0].double()  # (T, V)
            terms += [-torch.log_softmax(logits[i - 1], -1)[t.token_ids[i]]
                      for i in range(1, len(t.token_ids)) if t.loss_mask[i]]
    want = torch.stack(terms).mean()
    assert len(terms) == 4
    # float32 forward vs float64 reference: a relative tolerance far above float32's 1e-7 rounding of
    # a log-softmax over 151,936 logits, far below any masking or shift error (those change it by > 1%)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    # cut at max_len=4: the second-to-last target of the first sequence is the only one left of it
    cut = sft_loss(model, batch[:1], max_len=4)
    assert float(cut) == pytest.approx(float(terms[0] + terms[1]) / 2, rel=1e-5)


def test_token_share_counts_generated_tokens_by_span():
    t = _traj([1, 2, 3, 4, 5, 6, 7], [0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 2, 0, 0])
    share = token_share([t, t])
    assert (share.generated, share.reasoning, share.action) == (10, 6, 2)
    assert share.action_share == 0.2


def test_narration_restates_the_state_and_where_its_pieces_are():
    prompt = ("<|im_start|>user\nSolve it.\n\nInitial state:\n####\n#P_#\n#XO#\n####\n\nYou have 5 turns. "
              "Think<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n<|im_start|>user\n<tool_response>\nYou "
              "moved Down.\n####\n#__#\n#PX#\n####\n\nTurns used: 1 of 5.\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n")
    assert narrate(prompt, "Right") == (
        "The current state is:\nYou moved Down.\n####\n#__#\n#PX#\n####\nP at row 3, column 2.\n"
        "X at row 3, column 3.\nI pick the move that follows my plan from here: Right.")


def test_expert_demonstrations_win_every_train_game_with_reasoning_before_each_action():
    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    cfg = SFTConfig(kind="sokoban", train_games=6)
    trajs, won = demonstrations(cfg, tok)
    assert len(trajs) == 6 and won == 1.0
    assert all(t.stop_reason == "won" and t.drift_tokens == 0 for t in trajs)
    for t in trajs:
        text = tok.decode(list(t.token_ids))
        assert text.count("<think>\nThe current state is:") == t.num_turns == text.count("</think>\n\n"
                                                                                         "<answer>")
    share = token_share(trajs)
    assert 0 < share.action < share.reasoning and share.action_share < 0.15
    plain, _ = demonstrations(SFTConfig(kind="sokoban", train_games=6, reasoning=False), tok)
    assert token_share(plain).reasoning == 0 and token_share(plain).action == share.action


@pytest.mark.parametrize("compact", [False, True], ids=["qwen-vocab", "compact-vocab"])
def test_swerl_sft_trains_saves_and_the_saved_model_evaluates_as_reported(tmp_path, compact):
    out = tmp_path / "sft"
    # Qwen's 151,936-id output layer makes each token ~6x dearer on CPU: fewer games there
    train, heldout = (24, 6) if compact else (12, 4)
    r = subprocess.run([sys.executable, "-m", "swerl.cli", "sft", "kind=frozenlake", f"train_games={train}",
                        f"heldout_games={heldout}", "epochs=2", "batch_size=6", "model.hidden_size=64",
                        "model.num_layers=1", "model.intermediate_size=128", "max_turns=6",
                        "eval_max_new_tokens=64", f"out={out}", f"compact_vocab={str(compact).lower()}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "sft.json").read_text())
    assert report["train_games"] == train and report["heldout_games"] == heldout
    assert report["expert_win_rate"] == 1.0
    loss = report["epoch_loss"]
    assert len(loss) == 2 and loss[1] < loss[0]
    assert report["action_share"] == report["tokens"]["action"] / report["tokens"]["generated"]
    # the saved directory is the trained model: its greedy held-out success is the reported one
    from transformers import AutoModelForCausalLM

    from swerl.agent import load_tokenizer
    from swerl.sft import heldout_success

    model = AutoModelForCausalLM.from_pretrained(out / "model", dtype="float32")
    tok = load_tokenizer(out / "model")
    # a compact vocabulary: the output layer has one row per compact id, and the saved tokenizer is it
    assert (model.config.vocab_size == len(tok) < 1000) if compact else model.config.vocab_size == 151936
    assert (out / "model" / "swerl_compact_vocab.json").is_file() == compact
    cfg = SFTConfig(kind="frozenlake", heldout_games=heldout, max_turns=6, eval_max_new_tokens=64)
    again, trajs = heldout_success(cfg, model, tok)
    assert again == report["heldout_success"] and len(trajs) == heldout
    assert "held-out success" in r.stdout


def test_compact_vocab_needs_a_new_tiny_model(tmp_path):
    with pytest.raises(ValueError, match="compact_vocab builds a new tiny model"):
        SFTConfig(kind="frozenlake", compact_vocab=True, model=ModelConfig(path=str(tmp_path)))


def test_bad_sft_input_is_one_clear_line():
    r = subprocess.run([sys.executable, "-m", "swerl.cli", "sft", "kind=chess"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "sft kind must be a text-game kind" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "sft").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_sft_configs_load(path):
    from swerl.config import load

    cfg = load(SFTConfig, path)
    assert cfg.train_games > 0 and cfg.out
