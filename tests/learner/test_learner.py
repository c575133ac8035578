"""The learner: batching, log-probs, the GRPO update against a hand-built loss, checkpoints, configs."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from swerl.config import ConfigError, load
from swerl.learner import (
    ActFocusConfig,
    AEMConfig,
    AlgoConfig,
    KLConfig,
    Learner,
    OptimConfig,
    collate,
    latest_checkpoint,
    load_checkpoint,
    loss_positions,
    pack_micro_batches,
    save_checkpoint,
    sequence_stats,
    shared_prefix,
)
from swerl.models import make_toy_model
from swerl.structs import Trajectory

VOCAB = 12


def _traj(rng: random.Random, prompt: int, turns: int, reward: float) -> Trajectory:
    """A random multi-turn trajectory: prompt, then per turn 3 reasoning + 1 action + 2 observation."""
    ids, mask, span, lp, turn = [], [], [], [], []
    for _ in range(prompt):
        ids.append(rng.randrange(VOCAB)), mask.append(0), span.append(0), lp.append(0.0), turn.append(-1)
    for t in range(turns):
        for k in range(4):
            ids.append(rng.randrange(VOCAB)), mask.append(1), span.append(2 if k == 3 else 1)
            lp.append(-rng.uniform(1.5, 3.5)), turn.append(t)
        if t + 1 < turns:
            for _ in range(2):
                ids.append(rng.randrange(VOCAB)), mask.append(0), span.append(0), lp.append(0.0), turn.append(
                    -1)
    return Trajectory(token_ids=tuple(ids), loss_mask=tuple(mask), span=tuple(span), logprobs=tuple(lp),
                      turn_index=tuple(turn), prompt_len=prompt, terminated=True, truncated=False,
                      stop_reason="test", reward=reward)


def _batch(seed: int = 0, groups: int = 3, n: int = 4):
    rng = random.Random(seed)
    trajs, labels = [], []
    for g in range(groups):
        for _ in range(n):
            trajs.append(_traj(rng, rng.randrange(2, 5), rng.randrange(1, 4), float(rng.random() < 0.5)))
            labels.append(g)
    return collate(trajs, labels)


def _model(seed: int = 0, dtype: torch.dtype = torch.float32):
    """The tiny policy. Tests that compare two computations of the same numbers use dtype=float64:
    fp32 BLAS/softmax kernels differ by CPU vendor (summation order, FMA, AVX2 vs AVX-512) at the
    2⁻²⁴ ≈ 6e-8 level, and AEM's min–max normalisation amplifies that by a data-dependent factor;
    in fp64 (u = 2⁻⁵³ ≈ 1.1e-16) the same differences are ~1e-16 and a tolerance of 1e-9 is safe."""
    return make_toy_model(VOCAB, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                          intermediate_size=64, seed=seed).to(dtype)


def test_collate_shapes_and_masks():
    rng = random.Random(1)
    a, b = _traj(rng, 2, 1, 1.0), _traj(rng, 3, 3, 0.0)
    batch = collate([a, b], [0, 0], pad_id=0)
    width = max(len(a.token_ids), len(b.token_ids))
    for name in ("input_ids", "attention_mask", "loss_mask", "span", "turn_index", "old_logp"):
        assert getattr(batch, name).shape == (2, width), name
    assert batch.lengths.tolist() == [len(a.token_ids), len(b.token_ids)]
    n = len(a.token_ids)
    assert batch.attention_mask[0].tolist() == [1] * n + [0] * (width - n)
    assert batch.loss_mask[0, :n].tolist() == list(a.loss_mask) and batch.loss_mask[0, n:].sum() == 0
    assert batch.turn_index[0, n:].eq(-1).all() and batch.span[0, n:].eq(0).all()
    # stored as fp32: one rounding of values in [−3.5, 0], error ≤ 3.5·2⁻²⁴ ≈ 2.1e-7 < 1e-6 (no kernel)
    assert batch.old_logp[1].tolist() == pytest.approx(list(b.logprobs), abs=1e-6)
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.group.tolist() == [0, 0]
    sub = batch.select([0])
    assert sub.input_ids.shape == (1, n)  # trimmed to its own length


def test_collate_rejects_unrewarded_and_first_token_in_loss():
    t = _traj(random.Random(0), 2, 1, 1.0)
    with pytest.raises(ValueError, match="no reward"):
        collate([Trajectory(**{**t.__dict__, "reward": None})], [0])
    bad = Trajectory(**{**t.__dict__, "loss_mask": (1, *t.loss_mask[1:])})
    with pytest.raises(ValueError, match="first token"):
        collate([bad], [0])


def test_pack_micro_batches_respects_budget():
    lengths = [5, 17, 3, 9, 9, 30, 1]
    micro = pack_micro_batches(lengths, 20)
    assert sorted(i for mb in micro for i in mb) == list(range(len(lengths)))
    for mb in micro:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 20
    assert [5] in micro  # the over-budget row is alone
    assert pack_micro_batches(lengths, 10_000) == [[5, 1, 3, 4, 0, 2, 6]]
    with pytest.raises(ValueError, match="token_budget"):
        pack_micro_batches(lengths, 0)


def test_sequence_stats_match_full_logits():
    # fp64 model: chunked head vs the model's own lm_head differ only in fp64 summation order
    # (H = 32-term dot products, V = 12-term softmax sums, |logits| < 1 → ≲ 50·2⁻⁵³ ≈ 6e-15)
    model, batch = _model(dtype=torch.float64), _batch()
    s = sequence_stats(model, batch, chunk_size=7)
    assert s.logp.dtype == s.entropy.dtype == s.energy.dtype == torch.float64
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    lsm = torch.log_softmax(logits, -1)
    ref = lsm.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    real = batch.attention_mask[:, 1:].bool()
    torch.testing.assert_close(s.logp[real], ref[real], atol=1e-10, rtol=1e-10)
    ent = -(lsm.exp() * lsm).sum(-1)
    torch.testing.assert_close(s.entropy[real], ent[real], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s.energy[real], -torch.logsumexp(logits, -1)[real], atol=1e-10, rtol=1e-10)


def test_sequence_stats_where_runs_the_head_on_the_chosen_tokens_only(monkeypatch):
    """`where` (the learner's loss positions): the same numbers and gradients there as the full pass,
    0 elsewhere, and the LM head sees only those tokens. fp64: both paths run the same kernels on the
    same hidden states, the head's products only on fewer rows (differences ~1e-16, tolerance 1e-12)."""
    model, batch = _model(dtype=torch.float64), _batch()
    where = loss_positions(batch)
    assert 0 < int(where.sum()) < int(batch.attention_mask[:, 1:].sum())  # prompt / tool tokens exist
    rows_seen = []
    orig = torch.mm

    def counting_mm(a, b, *args, **kwargs):
        if b.shape[0] == model.lm_head.weight.shape[1] and b.shape[1] == VOCAB:  # h @ Wᵀ: (n, H) x (H, V)
            rows_seen.append(a.shape[0])
        return orig(a, b, *args, **kwargs)

    full = sequence_stats(model, batch, chunk_size=7)
    with monkeypatch.context() as m:
        m.setattr(torch, "mm", counting_mm)
        part = sequence_stats(model, batch, chunk_size=7, where=where)
    assert sum(rows_seen) == int(where.sum())
    for name in ("logp", "entropy", "energy"):
        a, b = getattr(part, name), getattr(full, name)
        torch.testing.assert_close(a[where], b[where], atol=1e-12, rtol=1e-12)
        assert a[~where].eq(0).all(), name

    def grads(**kw):
        model.zero_grad()
        s = sequence_stats(model, batch, chunk_size=7, **kw)
        (torch.where(where, s.logp, 0.0) * torch.linspace(-1, 1, where.numel(), dtype=torch.float64)
         .view_as(where)).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    g_full, g_part = grads(), grads(where=where)
    for n, g in g_full.items():
        torch.testing.assert_close(g_part[n], g, atol=1e-12, rtol=1e-10, msg=n)

    # an empty micro-batch's zero loss still reaches every weight (DeepSpeed's reductions wait on each)
    model.zero_grad(set_to_none=True)
    empty = sequence_stats(model, batch, chunk_size=7, where=torch.zeros_like(where))
    assert empty.logp.eq(0).all() and empty.logp.shape == where.shape
    (empty.logp.sum() * 0.0).backward()
    assert all(p.grad is not None and p.grad.eq(0).all() for p in model.parameters())
    with pytest.raises(ValueError, match="where must be a bool tensor"):
        sequence_stats(model, batch, chunk_size=7, where=where[:, 1:])


def test_sequence_stats_feeds_a_shared_prefix_once():
    """A group's rows share their prompt: with `prefix` it is fed for one row and the others attend to its
    keys and values; the stats at every wanted entry and the gradients are those of the plain pass.
    fp64 forward: the same products summed in another order, ~1e-16 (tolerance 1e-12). Gradients: the
    RMSNorms compute in float32 (transformers casts in and out), so a gradient through a norm is rounded to
    2^-24 ~ 6e-8 relative; the plain pass rounds each row's gradient at the prefix, the shared one their
    sum. <= 4 rows x 2 norms x 2 layers such roundings bound the difference by ~16 * 6e-8 ~ 1e-6 of the
    largest gradient (measured: 2e-8)."""
    rng = random.Random(3)
    prompt = [rng.randrange(VOCAB) for _ in range(5)]
    trajs = []
    for turns in (1, 3, 2, 3):  # different lengths: right padding after the shorter rows
        t = _traj(rng, 0, turns, 1.0)
        trajs.append(Trajectory(**{**t.__dict__, "token_ids": (*prompt, *t.token_ids),
                                   "loss_mask": (0,) * 5 + t.loss_mask, "span": (0,) * 5 + t.span,
                                   "logprobs": (0.0,) * 5 + t.logprobs,
                                   "turn_index": (-1,) * 5 + t.turn_index, "prompt_len": 5}))
    batch = collate(trajs, [0] * 4)
    model, where = _model(dtype=torch.float64), loss_positions(batch)
    # the prompt's 5 tokens; the entry about the first generated token (5) is computed from position 4
    assert shared_prefix(batch, where) == 4
    assert shared_prefix(batch.select([0]), where[:1]) == 0  # one row: nothing to share

    def run(prefix: int) -> tuple:
        model.zero_grad()
        s = sequence_stats(model, batch, chunk_size=7, where=where, prefix=prefix)
        (torch.where(where, s.logp, 0.0) * torch.linspace(-1, 1, where.numel(), dtype=torch.float64)
         .view_as(where)).sum().backward()
        return s, {n: p.grad.clone() for n, p in model.named_parameters()}

    (plain, g_plain), (shared, g_shared) = run(0), run(4)
    for name in ("logp", "entropy", "energy"):
        a, b = getattr(shared, name), getattr(plain, name)
        assert a.shape == b.shape == where.shape
        torch.testing.assert_close(a[where], b[where], atol=1e-12, rtol=1e-12)
        assert a[~where].eq(0).all(), name
    for n, g in g_plain.items():
        assert float((g_shared[n] - g).abs().max()) <= 1e-6 * float(g.abs().max()), n
    with pytest.raises(ValueError, match="not a shared prefix"):
        sequence_stats(model, batch, chunk_size=7, where=where, prefix=6)  # an entry wanted at 4, 5
    with pytest.raises(ValueError, match="not a shared prefix"):
        sequence_stats(model, batch, chunk_size=7, prefix=4)  # no `where`


def _hand_grpo_loss(model, batch, clip=0.2, dual=3.0):
    """GRPO with token-mean aggregation, written out from the formulas (full logits)."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].double()
        logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    adv = torch.zeros(batch.size)
    for g in batch.group.unique():
        sel = batch.group == g
        r = batch.rewards[sel].double()
        adv[sel] = ((r - r.mean()) / (r.std() + 1e-6)).float()
    mask = batch.loss_mask[:, 1:].bool()
    a = adv[:, None].expand_as(logp)
    ratio = torch.exp(logp - batch.old_logp[:, 1:])
    per = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
    per = torch.where(a < 0, torch.minimum(per, -dual * a), per)
    return float(per[mask].mean())


@pytest.mark.parametrize("micro_tokens", [100_000, 24])
def test_plain_grpo_update_equals_hand_built_loss(micro_tokens):
    model, batch = _model(dtype=torch.float64), _batch()
    # old log-probs near the current ones, so ratios straddle the clip range
    with torch.no_grad():
        s = sequence_stats(model, batch, chunk_size=64)
    noise = torch.randn(s.logp.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    old = torch.zeros_like(batch.old_logp)
    old[:, 1:] = torch.where(batch.loss_mask[:, 1:].bool(), s.logp + noise, 0.0)
    batch = type(batch)(**{**batch.__dict__, "old_logp": old})
    expected = _hand_grpo_loss(model, batch)
    learner = Learner(model, AlgoConfig(), OptimConfig(lr=1e-3, micro_batch_tokens=micro_tokens))
    m = learner.update(batch)
    assert not m.skipped and m.step == 1
    # fp64 model (log-probs, ratios, loss); the advantages are fp32 on both sides, each computed in
    # fp64 from 0/1 rewards and rounded once (elementwise, no kernel-dependent reduction): what is left
    # is fp64 summation order, ~1e-16
    assert m.loss == pytest.approx(expected, abs=1e-10)
    assert m.clipfrac_low + m.clipfrac_high > 0  # the clip was exercised
    assert m.aem_alpha_mean == 1.0 and m.actfocus_weight_action == 1.0 and learner.reference is None


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("aem", [False, True])
def test_micro_batching_gives_the_full_batch_gradient(agg, aem):
    # With AEM, one micro-batch takes the entropies from the loss pass itself and several take them
    # from a separate no-grad sweep: both must give the same update. In fp32 they do not, to a
    # tolerance that holds on every CPU: the micro-batches are padded differently, so the kernels
    # sum in different orders (entropies differ by ~1e-7), and AEM's min–max normalisation of the
    # response entropies amplifies that ~30× (α_max off by 3e-6 on AMD EPYC). In fp64 the
    # entropies agree to ~1e-15; the learner keeps them as fp32, rounded alike unless one lies within
    # 1e-15 of a rounding boundary (odds 1e-15/2⁻²² ≈ 4e-9 per token), so α is bit-identical and the
    # rest differs by fp64 summation order (≲ 1e-15, measured ≤ 6e-17): 1e-9 leaves 10⁵ of margin,
    # while a lost micro-batch, a wrong micro-batch weight, entropies put on the wrong rows or α
    # normalised per micro-batch move loss and grad_norm by ≥ 5% (checked by mutation).
    batch = _batch(seed=3)
    results = []
    for budget in (100_000, 20):
        algo = AlgoConfig(loss_agg=agg, kl=KLConfig(coef=0.1), aem=AEMConfig(enabled=aem, lam=2.0))
        learner = Learner(_model(dtype=torch.float64), algo, OptimConfig(lr=1e-2, micro_batch_tokens=budget))
        grads = []
        step = learner._optimizer_step  # the seam: capture the accumulated gradient before the step

        def capture(step=step, grads=grads, learner=learner):
            grads.extend(p.grad.detach().clone() for p in learner.policy.parameters())
            return step()

        learner._optimizer_step = capture
        results.append((learner.update(batch), grads))
    (m1, g1), (m2, g2) = results
    assert m2.micro_batches > 1 and m1.micro_batches == 1
    assert m1.loss == pytest.approx(m2.loss, rel=1e-9, abs=1e-12)
    assert (m1.aem_alpha_max > 1.0) == aem and m1.aem_alpha_max == m2.aem_alpha_max  # same fp32 entropies
    assert m1.grad_norm == pytest.approx(m2.grad_norm, rel=1e-9)
    for a, b in zip(g1, g2, strict=True):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)  # |gradients| ≤ 0.2


def test_all_switches_on_runs_and_reports():
    algo = AlgoConfig(estimator="rloo", dapo_filter=True, aem=AEMConfig(enabled=True, lam=2.0),
                      actfocus=ActFocusConfig(enabled=True, alpha=0.2, beta=0.5), kl=KLConfig(coef=0.05),
                      clip_high=0.28)
    from swerl.learner.config import OverlongConfig

    algo = AlgoConfig(**{**algo.__dict__, "overlong": OverlongConfig(enabled=True, max_len=12, buffer_len=6)})
    learner = Learner(_model(), algo, OptimConfig(lr=1e-3, micro_batch_tokens=30))
    m = learner.update(_batch(seed=5))
    assert not m.skipped
    assert m.aem_alpha_min <= 1.0 <= m.aem_alpha_max
    # every reasoning weight is fp32 0.2 (2⁻²⁶ off); their mean is an fp32 sum of N < m.tokens of them
    # (summation order is the CPU's), then a division: relative error ≤ (N − 1)·2⁻²⁴ + 2⁻²⁴ + 2⁻²⁶
    assert m.actfocus_weight_reasoning == pytest.approx(0.2, rel=m.tokens * 2**-24)
    assert 1.0 <= m.actfocus_weight_action <= 1.5
    assert m.kl == m.kl and m.energy_action == m.energy_action  # not NaN
    assert m.reward_shaped_mean < m.reward_mean  # long episodes were penalised
    assert 0 < m.action_token_share < 1


def test_dapo_filter_skips_a_batch_without_signal():
    rng = random.Random(0)
    trajs = [_traj(rng, 2, 2, 1.0) for _ in range(4)]
    learner = Learner(_model(), AlgoConfig(dapo_filter=True), OptimConfig())
    m = learner.update(collate(trajs, [0, 0, 1, 1]))
    assert m.skipped and m.episodes_kept == 0 and learner.step == 0


def test_checkpoint_roundtrip_gives_identical_next_update(tmp_path):
    algo = AlgoConfig(aem=AEMConfig(enabled=True), actfocus=ActFocusConfig(enabled=True),
                      kl=KLConfig(coef=0.1))
    optim = OptimConfig(lr=1e-3)
    b1, b2 = _batch(seed=1), _batch(seed=2)
    init = _model(seed=7)
    a = Learner(copy.deepcopy(init), algo, optim)
    a.update(b1)
    path = save_checkpoint(tmp_path, a.step, {"learner": a.state_dict()})
    assert latest_checkpoint(tmp_path) == path and not list(path.parent.glob(".tmp-*"))
    ma = a.update(b2)

    b = Learner(copy.deepcopy(init), algo, optim)  # same initial weights: same reference model
    b.load_state_dict(load_checkpoint(path)["learner"])
    assert b.step == 1
    mb = b.update(b2)
    assert ma.loss == mb.loss and ma.grad_norm == mb.grad_norm and mb.step == 2
    for x, y in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        assert torch.equal(x, y)


def test_export_hf_roundtrip(tmp_path):
    from transformers import AutoModelForCausalLM

    learner = Learner(_model(), AlgoConfig(), OptimConfig())
    out = learner.export_hf(tmp_path / "policy")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for (k, v), (k2, v2) in zip(learner.policy.state_dict().items(), loaded.state_dict().items(),
                                strict=True):
        assert k == k2 and torch.equal(v, v2)


def test_unknown_config_key_is_named():
    from swerl.train import TrainConfig

    with pytest.raises(ConfigError, match=r"algo\.aem\.lamda"):
        load(TrainConfig, "configs/toy_cpu.yaml", ["algo.aem.lamda=2"])


def test_impossible_batch_fails_before_any_work(tmp_path):
    from swerl.train import TrainConfig

    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="batch_episodes 60 is not a whole number of groups"):
        load(TrainConfig, "configs/toy_cpu.yaml", ["batch_episodes=60", f"run_dir={run_dir}"])
    with pytest.raises(ConfigError, match="group_size 1"):
        load(TrainConfig, "configs/toy_cpu.yaml", ["group_size=1", "batch_episodes=8"])
    with pytest.raises(ConfigError, match="estimator"):
        load(TrainConfig, "configs/toy_cpu.yaml", ["algo.estimator=ppo"])
    assert not run_dir.exists()


def _engine_off_by(batch, model, log_factor: float):
    """The batch with engine log-probs = the learner's + log_factor on every trained token: an engine
    that finds each sampled token e^log_factor times as likely, so r = π_old/μ = e^−log_factor."""
    with torch.no_grad():
        s = sequence_stats(model, batch, chunk_size=64)
    old = torch.zeros_like(batch.old_logp)
    old[:, 1:] = torch.where(batch.loss_mask[:, 1:].bool(), s.logp + log_factor, 0.0)
    return type(batch)(**{**batch.__dict__, "old_logp": old})


def test_rollout_is_reweights_each_token_by_the_learner_over_engine_ratio():
    import math

    from swerl.learner import RolloutISConfig

    def update(rollout_is: RolloutISConfig):
        model = _model(dtype=torch.float64)
        batch = _engine_off_by(_batch(), model, math.log(2.0))
        algo = AlgoConfig(recompute_old_logp=True, rollout_is=rollout_is, dual_clip=None)
        return Learner(model, algo, OptimConfig(lr=1e-3)).update(batch), batch

    (off, batch), (tis, _), (mis, _) = (update(RolloutISConfig()),
                                        update(RolloutISConfig(mode="truncate", cap=2.0)),
                                        update(RolloutISConfig(mode="mask", cap=1.5)))
    # the batch stores the engine's log-probs in fp32 (one rounding each, |error| ≤ |logp|·2⁻²⁴) and
    # exp() turns that absolute error into a relative one of r: everything else is fp64
    rel = float(batch.old_logp.abs().max()) * 2**-24 * 2
    # the first (only) optimizer step has π = π_old, so each token's term is −A·w, clipping inactive:
    # truncation at a cap above r = 1/2 leaves w = 1/2 on every token, half the uncorrected loss
    assert tis.pg_loss == pytest.approx(0.5 * off.pg_loss, rel=rel) and off.pg_loss != 0
    # masked with lower bound 1/1.5: r = 1/2 is out of range on every token, nothing is left to learn
    assert mis.pg_loss == 0.0 and mis.is_capped_fraction == 1.0
    for m in (off, tis, mis):  # the mismatch is measured whether or not it is corrected
        assert (m.is_ratio_mean == pytest.approx(0.5, rel=rel)
                and m.is_ratio_max == pytest.approx(0.5, rel=rel))
        assert m.mismatch_kl_k1 == pytest.approx(math.log(2.0), abs=rel)
        assert m.mismatch_kl_k3 == pytest.approx(0.5 - 1 + math.log(2.0), abs=rel)
    assert off.is_capped_fraction == 0.0 and tis.is_capped_fraction == 0.0


def test_rollout_is_needs_the_learners_own_old_log_probs():
    from swerl.learner import RolloutISConfig

    with pytest.raises(ValueError, match="rollout_is needs recompute_old_logp"):
        AlgoConfig(rollout_is=RolloutISConfig(mode="truncate"))
    with pytest.raises(ValueError, match=r"rollout_is\.cap must be >= 1"):
        RolloutISConfig(mode="mask", cap=0.5)
