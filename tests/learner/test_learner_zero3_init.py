"""ZeRO-3 construction from a model factory: the policy and the frozen reference are built partitioned
over the ranks (transformers' HfDeepSpeedConfig + deepspeed.zero.Init, `swerl.learner.ds_learner.
zero3_construction`), so no rank ever holds the whole model, and the update is still the single-process
`Learner`'s. Real DeepSpeed 0.19 in 2 torchrun processes over gloo on CPU (tests/learner/ds_worker.py).

The factory cases: the toy model's constructor run under zero.Init (transformers' weight init on each
module's gathered parameters must reproduce the seeded plain init exactly), from_pretrained of the
same weights (transformers copies the checkpoint into the partitions), LoRA put on the partitioned
base, and a bf16 factory. Tolerances as in tests/learner/test_learner_deepspeed.py.

Memory: a probe in the worker records, during each factory call, the most parameter bytes the rank held
materialised at once (sampled at every parameter registration and every ZeRO-3 gather), on a model
big enough that one module (the 4096 × 256 embedding, ~1/5 of the weights) is far from the whole.
The same probe, sampled at every gather and every bucket, bounds what `iter_weight_buckets` (weight sync
in memory) materialises while it streams the partitioned policy out.
"""

from __future__ import annotations

import math

import ds_worker as W
import pytest
import torch
from test_learner_deepspeed import _assert_same_update, _torchrun

from swerl.learner import AlgoConfig, KLConfig, Learner, LearnerConfig, LoRAConfig, OptimConfig, make_learner

TWO_RANK_CASES = ("z3_factory", "z3_factory_hf", "z3_factory_lora", "z3_factory_bf16")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The factory cases, the memory probe and the bad factories, in one 2-rank launch."""
    out = tmp_path_factory.mktemp("z3init")
    _torchrun(out, "--cases", ",".join([*TWO_RANK_CASES, "memory", "errors"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", TWO_RANK_CASES)
def test_partitioned_construction_update_equals_the_single_process_learner(runs, name):
    res = torch.load(runs / f"{name}.pt", weights_only=False)
    _assert_same_update(res, name, 2, bf16=W.CASES[name][2].bf16)


def _full_numel() -> dict[str, int]:
    """Each parameter's size in the plain (unpartitioned) memory model; a tied weight once."""
    return {k: p.numel() for k, p in W.memory_model().named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_only_ever_holds_partitions_under_zero3(runs, rank):
    records = torch.load(runs / f"memory-rank{rank}.pt", weights_only=False)
    numel = _full_numel()
    full_bytes = 4 * sum(numel.values())  # fp32
    embed_bytes = 4 * W.MEMORY_MODEL["vocab_size"] * W.MEMORY_MODEL["hidden_size"]  # the largest module
    assert embed_bytes < 0.25 * full_bytes  # the model is big enough for the bound below to mean something
    for key in ("z3_init", "z3_hf"):
        calls = records[key]
        assert len(calls) == 2, key  # the policy, then the frozen reference: both built by the factory
        for call in calls:
            assert call["full_bytes"] == full_bytes, key
            # no rank ever had more than about one module whole: the embedding, while it was created
            # (and gathered for its init / checkpoint copy), then partitioned
            assert embed_bytes <= call["peak_param_bytes"] < 0.3 * full_bytes, (key, call["peak_param_bytes"])
            # afterwards nothing is whole and this rank keeps its half of every parameter
            assert call["materialised_bytes"] == 0, key
            assert call["partition_numel"] == {k: math.ceil(n / 2) for k, n in numel.items()}, key
    # ZeRO-2 for contrast: one factory call (the reference is a copy) and the whole model on every rank,
    # at its peak plus the LM head's own weight, created before it is tied to the embedding
    (plain,) = records["z2_init"]
    assert plain["materialised_bytes"] == full_bytes
    assert plain["peak_param_bytes"] == full_bytes + embed_bytes


@pytest.mark.slow
def test_factories_that_break_the_contract_are_refused_with_what_to_do(runs):
    errors = torch.load(runs / "errors.pt", weights_only=False)
    kind, msg = errors["prebuilt"]
    assert kind == "ValueError" and "not ZeRO-3 partitions" in msg and ("construct the model when "
                                                                        "called") in msg
    kind, msg = errors["unseeded"]
    assert kind == "ValueError" and "different weights on its second call" in msg and "seed" in msg


# ---- weight sync in buckets from the partitioned policy ------------------------------------------------


@pytest.fixture(scope="module")
def bucket_runs(tmp_path_factory):
    """`iter_weight_buckets` drained on both ranks of a ZeRO-3 learner built partitioned (ds_worker
    `buckets`)."""
    out = tmp_path_factory.mktemp("z3buckets")
    _torchrun(out, "--cases", "buckets")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_zero3_weight_buckets_are_the_full_model_one_module_gathered_at_a_time(bucket_runs, rank):
    """Every rank gets the whole policy, in buckets of at most the size (a larger weight alone), each
    weight once (the tied LM head under the embedding's name) and bit-equal to the same seeded model
    built in one process; while streaming, the rank never held more than one module's parameters
    gathered (the embedding, the largest, ~1/5 of the model): what a bucket holds is copies."""
    results = torch.load(bucket_runs / f"buckets-rank{rank}.pt", weights_only=False)
    other = torch.load(bucket_runs / f"buckets-rank{1 - rank}.pt", weights_only=False)
    plain = W.memory_model().state_dict()
    names = [n for n in plain if n != "lm_head.weight"]  # tied to model.embed_tokens.weight
    numel = _full_numel()
    full_bytes = 4 * sum(numel.values())
    embed_bytes = 4 * W.MEMORY_MODEL["vocab_size"] * W.MEMORY_MODEL["hidden_size"]
    assert set(results) == set(W.BUCKET_MB)
    for mb, res in results.items():
        limit = int(mb * (1 << 20))
        buckets = res["buckets"]
        assert len(buckets) > 5, mb
        assert [b["index"] for b in buckets] == list(range(len(buckets)))
        assert [b["last"] for b in buckets] == [False] * (len(buckets) - 1) + [True]
        for b in buckets:
            assert b["nbytes"] <= limit or len(b["names"]) == 1, (mb, b["names"], b["nbytes"])
        assert any(len(b["names"]) > 1 for b in buckets), mb  # the size packs, not only splits
        assert [n for b in buckets for n in b["names"]] == names, mb
        for b in buckets:
            for n, t in zip(b["names"], b["tensors"], strict=True):
                assert t.dtype == plain[n].dtype and torch.equal(t, plain[n]), (mb, n)
        assert res["meta"] == [(n, plain[n].dtype, tuple(plain[n].shape)) for n in names]
        # the same stream on the other rank
        for b, c in zip(buckets, other[mb]["buckets"], strict=True):
            assert b["names"] == c["names"] and all(map(torch.equal, b["tensors"], c["tensors"]))
        # memory: nothing whole before or after, at most one module's parameters gathered at any time,
        # never more than the largest module, far below the whole model; the partitions stay halves
        assert res["before_bytes"] == 0 and res["after_bytes"] == 0, mb
        assert res["modules_at_once"] == 1, mb
        assert res["peak_bytes"] == embed_bytes < 0.25 * full_bytes, (mb, res["peak_bytes"])
        assert res["peak_names"] == ["model.embed_tokens.weight"], mb
        assert res["partition_numel"] == {k: math.ceil(n / 2) for k, n in numel.items()}, mb


# ---- make_learner with a factory, single process (no DeepSpeed) ---------------------------------------


def test_torch_backend_calls_the_factory_once_and_trains_what_it_built():
    built = []

    def factory():
        built.append(W.model())
        return built[-1]

    learner = make_learner(factory, AlgoConfig(kl=KLConfig(coef=0.1)), OptimConfig(), LearnerConfig())
    assert type(learner) is Learner and len(built) == 1 and learner.policy is built[0]
    assert learner.reference is not built[0]  # the frozen copy the plain learner takes
    lora = make_learner(factory, AlgoConfig(), OptimConfig(),
                        LearnerConfig(lora=LoRAConfig(enabled=True, r=2)))
    assert len(built) == 2 and hasattr(lora.policy, "peft_config")


def test_make_learner_refuses_what_is_neither_a_model_nor_a_factory():
    with pytest.raises(TypeError, match="zero-argument callable"):
        make_learner("models/qwen", AlgoConfig(), OptimConfig(), LearnerConfig())
