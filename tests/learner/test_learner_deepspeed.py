"""The DeepSpeed learner against the single-process `Learner`: real DeepSpeed 0.19 engines in 2 torchrun
processes over gloo on CPU (ZeRO 0, 1, 2, 3 and LoRA on ZeRO-3), checkpoint → resume in fresh
processes, one process without a launcher (fp32 and bf16), HF export; plus the process-group helpers
and the config checks.

The worker (tests/learner/ds_worker.py) shards a fixed batch by whole rollout groups and runs one update per
case; here the same cases run on the full batch in one plain `Learner`, on the ranks' own micro-batches (see
`_reference`). DeepSpeed reduces no fp64 gradients on CPU, so this is fp32 throughout, and the tolerances
are set by what fp32 can differ in here. Every row is forwarded in the same tensor as on its rank, so the
first optimizer step's log-probs, entropies, AEM α and losses are the same numbers; what differs is the
order of fp32 gradient sums (per rank, then gloo's all-reduce, vs one process), ≲ 10·2⁻²⁴ ≈ 6e-7 of each
coordinate's summed |contributions|. Parameters agree to 1e-4 absolute, about 1% of the learning rate
(1e-2): Adam divides each coordinate's update by its own gradient scale, so a summation-order difference
in a near-zero gradient coordinate moves that coordinate's update by up to a fraction of lr (observed ≤
3.3e-5), while any wrong gradient moves whole tensors by ~lr. Losses and the pre-clip gradient norm agree
to 1e-5 relative: the first step's differ only through the gradient norm's sum order, later steps' (2
epochs, 2 mini-batches) through those parameter differences (observed ≤ 2e-7 relative). Adam hides a
global gradient scale, so the gradient norm check is what catches a wrong world-size scaling.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import ds_worker as W
import pytest
import torch

from swerl.learner import (
    Learner,
    LearnerConfig,
    LoRAConfig,
    OptimConfig,
    loss_positions,
    make_learner,
    pack_micro_batches,
    sequence_stats,
)
from swerl.learner.dist import init_distributed, shard_rows_by_group

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(W.__file__).resolve())
BIN = Path(sys.executable).parent
TWO_RANK_CASES = ("z0", "z1", "z2", "z3", "z3_aem1", "z3_lora")
RESUMED = ("z2", "z3")


def _run(cmd: list[str], timeout: float = 240) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


def _torchrun(out: Path, *args: str) -> None:
    _run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", WORKER, "--out", str(out), *args])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """All 2-rank cases in one launch, then the checkpointed ones resumed in a fresh pair of processes."""
    out = tmp_path_factory.mktemp("ds2")
    _torchrun(out, "--cases", ",".join(TWO_RANK_CASES))
    _torchrun(out, "--cases", ",".join(RESUMED), "--resume")
    return out


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> Path:
    """World size 1, started as a plain python process (no launcher)."""
    out = tmp_path_factory.mktemp("ds1")
    _run([sys.executable, WORKER, "--out", str(out), "--cases", "z2,z3_bf16"])
    return out


def _reference(name: str, world_size: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """The case on one plain Learner over the full batch: (metrics, full weights). With several
    mini-batches, each mini-batch is the union of the ranks' mini-batches: every rank shuffles its own
    rows with the learner's seeded generator and deals them into parts. Micro-batches are the ranks'
    too (each rank packs its own rows), and it runs on one thread like the workers: every row is then
    forwarded in the same rows × width tensor as on its rank, so its fp32 log-probs and entropies are
    the same numbers, not the same up to vendor-dependent kernel rounding that AEM's min–max
    normalisation would amplify. (That a different packing gives the same update is
    tests/learner/test_learner.py's fp64 micro-batching test.)"""
    from unittest import mock

    from swerl.learner import learner as learner_module

    algo, optim, lcfg, _, _ = W.CASES[name]
    b1, _ = W.batches()
    shards = [shard_rows_by_group(b1.group.tolist(), r, world_size, lengths=b1.lengths.tolist())
              for r in range(world_size)]
    gens = [torch.Generator().manual_seed(0) for _ in shards]
    # FIFO of what each packing call packs: the positions (into its lengths) of each rank's rows. The
    # learner packs the whole batch once (every row is kept: no case filters), then each mini-batch.
    segments: list[list[list[int]]] = [shards]

    def rank_packing(lengths, budget: int) -> list[list[int]]:
        segs = segments.pop(0)
        assert sorted(i for rows in segs for i in rows) == list(range(len(lengths)))
        return [[rows[i] for i in part] for rows in segs
                for part in pack_micro_batches([int(lengths[j]) for j in rows], budget)]

    def _mini_batches(self, k: int) -> list[list[int]]:
        n = self.optim_cfg.mini_batches
        parts: list[list[int]] = [[] for _ in range(n)]
        bounds: list[list[int]] = [[0] for _ in range(n)]
        for rows, gen in zip(shards, gens, strict=True):
            perm = torch.randperm(len(rows), generator=gen).tolist() if n > 1 else list(range(len(rows)))
            for i in range(n):
                parts[i] += [rows[j] for j in perm[i::n]]
                bounds[i].append(len(parts[i]))
        segments.extend([list(range(a, b)) for a, b in itertools.pairwise(ends)] for ends in bounds)
        return parts

    if lcfg.lora.enabled:
        from swerl.learner.lora import apply_lora

        # a factory case's adapters are put on by the learner (B = 0); the others start from lora_model
        policy = apply_lora(W.model(), lcfg.lora) if name in W.FACTORY_CASES else W.lora_model(lcfg.lora)
    else:
        policy = W.model()
    rank_union = type("RankUnion", (Learner,), {"_mini_batches": _mini_batches})
    learner = rank_union(policy, algo, optim, total_steps=W.TOTAL_STEPS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with mock.patch.object(learner_module, "pack_micro_batches", rank_packing):
            m = learner.update(b1)
    finally:
        torch.set_num_threads(threads)
    assert not segments  # every packing call was one the ranks made
    return m.__dict__, learner.policy_state_dict()


def _assert_same_update(res: dict, name: str, world_size: int, *, bf16: bool = False) -> None:
    ref_m, ref_p = _reference(name, world_size)
    got = res["metrics"]
    assert res["world_size"] == world_size
    for k in ("episodes", "episodes_kept", "tokens", "optimizer_steps", "step", "skipped",
              "energy_reward_corr_groups"):
        assert got[k] == ref_m[k], k
    rel = 2e-2 if bf16 else 1e-5
    for k in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "approx_kl", "aem_alpha_max",
              "actfocus_weight_action", "energy_action", "energy_reward_corr_pearson", "lr"):
        if ref_m[k] != ref_m[k]:  # NaN (the switch is off)
            assert got[k] != got[k], k
        else:
            assert got[k] == pytest.approx(ref_m[k], rel=rel, abs=1e-7 if not bf16 else 1e-3), k
    assert set(res["params"]) == set(ref_p)
    init = W.model().state_dict()
    moved = max(float((ref_p[k] - init[k]).abs().max()) for k in init)
    assert moved > 5e-3  # the update is far larger than the tolerance below
    if bf16:
        # metrics: bf16 weights and activations round to 2⁻⁹ relative at every op (observed ≤ 1.3e-3 off
        # the fp32 run), the kernels' fp32 accumulation order moves them by ~1e-7: rel=2e-2 above.
        # bf16 gradients have ~3 significant digits and Adam's first step is about lr·sign(g), so a
        # coordinate with a near-zero gradient may step the other way: compare the update's direction
        keys = [k for k in init if k != "lm_head.weight"]  # tied to the embedding
        got_u = torch.cat([(res["params"][k].float() - init[k]).flatten() for k in keys])
        ref_u = torch.cat([(ref_p[k] - init[k]).flatten() for k in keys])
        assert float(torch.nn.functional.cosine_similarity(got_u, ref_u, dim=0)) > 0.98
        return
    for k, v in ref_p.items():
        torch.testing.assert_close(res["params"][k], v, rtol=1e-4, atol=1e-4, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("name", TWO_RANK_CASES)
def test_two_ranks_update_equals_the_single_process_learner(two_ranks, name):
    _assert_same_update(torch.load(two_ranks / f"{name}.pt", weights_only=False), name, 2)


@pytest.mark.slow
def test_aem_with_one_micro_batch_per_rank_takes_no_entropy_pre_pass(two_ranks):
    # rank 0's policy forwards during the update: z3_aem1 has one micro-batch per rank and one step, so
    # AEM reads the entropies of the loss pass; z3 (several micro-batches, 2 epochs) needs the pre-pass
    aem1 = torch.load(two_ranks / "z3_aem1.pt", weights_only=False)
    z3 = torch.load(two_ranks / "z3.pt", weights_only=False)
    assert aem1["policy_forwards"] == 1
    micro = len(pack_micro_batches(W.local(W.batches()[0], 0, 2).lengths,
                                   W.CASES["z3"][1].micro_batch_tokens))
    assert micro > 1 and z3["policy_forwards"] >= micro * (1 + 2)  # pre-pass + 2 epochs of loss passes


@pytest.mark.slow
@pytest.mark.parametrize("name", RESUMED)
def test_resume_in_fresh_processes_equals_the_uninterrupted_run(two_ranks, name):
    straight = torch.load(two_ranks / f"{name}-next.pt", weights_only=False)
    resumed = torch.load(two_ranks / f"{name}-resumed.pt", weights_only=False)
    assert resumed["extra"] == {"train_step": 1, "note": name}
    assert (resumed["step"] == straight["step"]
            == 2 * W.CASES[name][1].ppo_epochs * W.CASES[name][1].mini_batches)
    assert resumed["metrics"]["loss"] == straight["metrics"]["loss"]
    assert resumed["metrics"]["grad_norm"] == straight["metrics"]["grad_norm"]
    assert resumed["metrics"]["lr"] == straight["metrics"]["lr"]
    for k, v in straight["params"].items():
        assert torch.equal(resumed["params"][k], v), k
    # one complete checkpoint (keep_last=1), no temporary directory left, a shard per rank
    ckpts = two_ranks / f"run-{name}" / "checkpoints"
    (only,) = [p.name for p in ckpts.iterdir()]
    assert only == f"step_{straight['step'] // 2:08d}"
    files = {p.name for p in (ckpts / only).iterdir()}
    assert {"state.pt", "deepspeed", "learner_rank00000.pt", "learner_rank00001.pt"} <= files
    assert len(list((ckpts / only / "deepspeed").glob("*optim_states.pt"))) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["z3", "z3_lora"])
def test_exported_policy_loads_as_plain_hf_and_reproduces_the_log_probs(two_ranks, name):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(two_ranks / f"export-{name}")
    assert type(loaded).__name__ == "Qwen2ForCausalLM" and not hasattr(loaded, "peft_config")
    weights = torch.load(two_ranks / f"{name}.pt", weights_only=False)["params"]
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, weights[k]), k
    b1, _ = W.batches()
    # the same weights (bit-equal above), batch and one thread as the worker: the same fp32 kernels on
    # the same tensors, so equal up to library nondeterminism; 1e-5 on |logp| ≲ 5 is that margin
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            logp = sequence_stats(loaded, b1, chunk_size=64, compute_entropy=False).logp
    finally:
        torch.set_num_threads(threads)
    policy_logp = torch.load(two_ranks / f"logp-{name}.pt")
    # the learner's forward (DeepSpeed's engine) runs the LM head at the tokens in the loss only
    where = loss_positions(b1)
    torch.testing.assert_close(logp[where], policy_logp[where], atol=1e-5, rtol=1e-5)
    assert policy_logp[~where].eq(0).all() and where.any()


@pytest.mark.slow
def test_one_process_without_launcher_equals_the_single_process_learner(one_rank):
    _assert_same_update(torch.load(one_rank / "z2.pt", weights_only=False), "z2", 1)


@pytest.mark.slow
def test_bf16_update_is_the_fp32_update_to_bf16_precision(one_rank):
    _assert_same_update(torch.load(one_rank / "z3_bf16.pt", weights_only=False), "z3_bf16", 1, bf16=True)


# ---- process-group helpers and configs (no DeepSpeed engine) ---------------------------------------


def test_shard_rows_by_group_deals_whole_groups_largest_first():
    groups = [0, 0, 1, 1, 2, 2, 3, 3, 4]
    lengths = [10, 10, 3, 3, 8, 8, 1, 1, 30]  # group tokens: 0→20, 1→6, 2→16, 3→2, 4→30
    # largest first: 4 (30) → rank 0, 0 (20) → rank 1, 2 (16) → rank 1 (20 < 30), 1 (6) → rank 0 (30 < 36),
    # 3 (2) → rank 0 (36 = 36: the lower rank)
    assert shard_rows_by_group(groups, 0, 2, lengths=lengths) == [2, 3, 6, 7, 8]
    assert shard_rows_by_group(groups, 1, 2, lengths=lengths) == [0, 1, 4, 5]
    # by rows: groups 0–3 of 2 rows, 4 of 1, over 3 ranks: 0, 1, 2 fill the empty ranks, 3 → rank 0
    # (loads 2, 2, 2: the lower rank), 4 → rank 1 (loads 4, 2, 2)
    by_rows = [shard_rows_by_group(groups, r, 3) for r in range(3)]
    assert by_rows == [[0, 1, 6, 7], [2, 3, 8], [4, 5]]
    assert sorted(i for rows in by_rows for i in rows) == list(range(len(groups)))
    with pytest.raises(ValueError, match="2 rollout groups cannot be spread over 3 ranks"):
        shard_rows_by_group([5, 5, 9], 0, 3)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        shard_rows_by_group(groups, 2, 2)


def test_init_distributed_is_a_no_op_without_a_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with init_distributed("auto") as info:
        assert (info.rank, info.world_size, info.backend, info.device) == (0, 1, None, "cpu")
        assert info.is_main and not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="nccl needs CUDA"), init_distributed("nccl", required=True):
        pass


def test_learner_config_rejects_inconsistent_settings():
    with pytest.raises(ValueError, match="backend must be one of"):
        LearnerConfig(backend="fsdp")
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3"):
        LearnerConfig(backend="deepspeed", zero_stage=4)
    with pytest.raises(ValueError, match=re.escape("offload_param needs learner.zero_stage: 3")):
        LearnerConfig(backend="deepspeed", zero_stage=2, offload_param=True)
    with pytest.raises(ValueError, match=re.escape("offload_optimizer needs learner.zero_stage >= 1")):
        LearnerConfig(backend="deepspeed", zero_stage=0, offload_optimizer=True)
    with pytest.raises(ValueError, match=re.escape("need learner.backend: deepspeed")):
        LearnerConfig(bf16=True)
    with pytest.raises(ValueError, match="lm_head"):
        LoRAConfig(enabled=True, target_modules=("q_proj", "lm_head"))
    assert LearnerConfig(backend="deepspeed").needs_process_group and not LearnerConfig().needs_process_group


def test_ds_config_carries_the_learner_settings():
    from swerl.learner.ds_learner import build_ds_config

    cfg = build_ds_config(LearnerConfig(backend="deepspeed", zero_stage=3, bf16=True, offload_optimizer=True,
                                        offload_param=True), OptimConfig(grad_clip=0.7), 4, cuda=True,
                          overrides={"zero_optimization": {"stage3_param_persistence_threshold": 0}})
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]
    assert zero["stage3_param_persistence_threshold"] == 0 and zero["overlap_comm"] is True
    assert cfg["bf16"] == {"enabled": True} and cfg["gradient_clipping"] == 0.7
    # the learner drives accumulation: DeepSpeed's own counter is 1 micro-batch per step per rank
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"],
            cfg["train_batch_size"]) == (1, 1, 4)
    assert build_ds_config(LearnerConfig(backend="deepspeed", zero_stage=0), OptimConfig(), 1, cuda=False,
                           clip=False)["gradient_clipping"] == 0.0


def test_deepspeed_learner_outside_a_process_group_says_what_to_do():
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="init_distributed"):
        make_learner(W.model(), W.CASES["z0"][0], OptimConfig(), LearnerConfig(backend="deepspeed"))
