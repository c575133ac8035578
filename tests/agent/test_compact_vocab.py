"""The compact vocabulary: the real Qwen tokenizer's text handling over a renumbered subset of its ids,
so a tiny CPU model's output layer has hundreds of rows instead of 151,936."""

from __future__ import annotations

import pytest

from swerl.agent import load_tokenizer
from swerl.agent.compact import COMPACT_FILE, CompactTokenizer, compact_vocabulary

TEXT = "<think>\nThe current state is:\nP at row 2, column 3.\n</think>\n\n<answer>Up</answer>"


@pytest.fixture(scope="module")
def base():
    return load_tokenizer()


@pytest.fixture(scope="module")
def compact(base):
    return compact_vocabulary(base, [base(TEXT, add_special_tokens=False)["input_ids"]])


def test_ids_are_renumbered_densely_and_text_round_trips(base, compact):
    base_ids = base(TEXT, add_special_tokens=False)["input_ids"]
    ids = compact(TEXT, add_special_tokens=False)["input_ids"]
    # the same BPE pieces, one compact id each, all within the compact table (row 0 is "unknown")
    assert len(ids) == len(base_ids) and min(ids) > 0 and max(ids) < len(compact)
    assert compact.to_base(ids) == base_ids
    assert compact.decode(ids) == base.decode(base_ids) == TEXT
    assert compact.convert_ids_to_tokens(ids) == base.convert_ids_to_tokens(base_ids)
    # far fewer rows than the base vocabulary: the text's pieces, the chat markup, the 256 bytes
    added = len(base.added_tokens_decoder)
    assert len(set(base_ids)) + 256 <= len(compact) <= 1 + len(set(base_ids)) + added + 256


def test_special_tokens_and_chat_markup_map_into_the_subset(base, compact):
    assert compact.eos_token_id == compact.convert_tokens_to_ids(base.eos_token)
    assert compact.to_base([compact.eos_token_id]) == [base.eos_token_id]
    assert compact.pad_token_id is not None and compact.pad_token_id != compact.unk_token_id
    added = compact.added_tokens_decoder
    assert {t.content for t in added.values()} == {t.content for t in base.added_tokens_decoder.values()}
    msgs = [{"role": "user", "content": "Up or Down?"}]
    text = compact.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == base.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = compact(text, add_special_tokens=False)["input_ids"]
    assert compact.decode(ids) == text


def test_text_outside_the_subset_is_spelled_out_in_bytes_and_round_trips(base, compact):
    for text in ("Down or Left?", "北京 ✓"):
        base_ids = base(text, add_special_tokens=False)["input_ids"]
        ids = compact(text, add_special_tokens=False)["input_ids"]
        assert compact.unk_token_id not in ids and compact.decode(ids) == text
        assert len(ids) > len(base_ids)  # unseen pieces cost one id per byte
    # "北" is three UTF-8 bytes, none of them a piece of TEXT: three single-byte ids
    assert len(compact("北", add_special_tokens=False)["input_ids"]) == 3
    # renumbering an existing id sequence is one for one: an id outside the subset is the unknown row
    outside = base("北京", add_special_tokens=False)["input_ids"]
    assert set(compact.to_compact(outside)) == {compact.unk_token_id}
    assert compact.decode([compact.unk_token_id]) == ""
    with pytest.raises(ValueError, match="outside the compact vocabulary"):
        compact.decode([len(compact)])


def test_save_and_load_round_trip_through_load_tokenizer(tmp_path, base, compact):
    compact.save_pretrained(tmp_path)
    assert (tmp_path / COMPACT_FILE).is_file()
    again = load_tokenizer(tmp_path)
    assert isinstance(again, CompactTokenizer) and again.base_ids == compact.base_ids
    assert again(TEXT, add_special_tokens=False)["input_ids"] == compact(TEXT, add_special_tokens=False)[
        "input_ids"]
    (tmp_path / COMPACT_FILE).write_text("{not json")
    with pytest.raises(RuntimeError, match="is not a compact vocabulary"):
        load_tokenizer(tmp_path)


def test_an_episode_with_the_compact_tokenizer_is_the_base_episode_renumbered(base, compact):
    import asyncio
    import dataclasses

    from swerl.agent import ScriptedEngine, run_episode
    from swerl.envs.games.env import PUZZLES, PuzzleEnv, make_puzzle

    turns = ["<think>\nThe current state is:\n</think>\n\n<answer>Up</answer>"] * 2
    spec = PUZZLES["frozenlake"]

    def play(tok):
        env = PuzzleEnv(make_puzzle("frozenlake"), "train-00001", spec.prompt,
                        dataclasses.replace(spec.config, max_steps=len(turns)))
        return asyncio.run(run_episode(env, ScriptedEngine(tok, turns), tok,
                                       limits=env.config.episode_limits()))

    b = play(base)
    small = compact_vocabulary(base, [b.token_ids])  # built from the episode, as `swerl sft` builds it
    c = play(small)
    assert c.token_ids == tuple(small.to_compact(b.token_ids))
    assert (c.loss_mask, c.span, c.turn_index, c.reward) == (b.loss_mask, b.span, b.turn_index, b.reward)


def test_train_refuses_a_compact_model_on_a_server_engine(tmp_path, compact):
    from swerl.config import load
    from swerl.train import TrainConfig, _check_paths

    (tmp_path / "config.json").write_text("{}")
    compact.save_pretrained(tmp_path)
    cfg = load(TrainConfig, None, [f"model.path={tmp_path}", "rollout.engine=vllm", "env.kind=frozenlake"])
    with pytest.raises(ValueError, match=r"compact vocabulary .* set rollout\.engine=hf"):
        _check_paths(cfg)
