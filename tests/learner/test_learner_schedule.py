"""PPO epochs / mini-batches, the LR schedule, gradient checkpointing and recomputed old log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from test_learner import _batch, _model

from swerl.learner import AEMConfig, AlgoConfig, Learner, OptimConfig
from swerl.learner.config import lr_factor


def test_lr_factor_hand_computed():
    warm = OptimConfig(lr=1.0, warmup_steps=3)
    # warmup rises linearly to the peak at step 3: 1/4, 2/4, 3/4, then 1
    assert [lr_factor(i, warm, None) for i in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cos = OptimConfig(lr=1.0, lr_schedule="cosine", min_lr_ratio=0.2)
    # 5 steps: progress 0, 1/4, 1/2, 3/4, 1 → 0.2 + 0.8·½(1 + cos(π·p))
    expected = [0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75, 1.0)]
    assert [lr_factor(i, cos, 5) for i in range(5)] == pytest.approx(expected)
    assert lr_factor(4, cos, 5) == pytest.approx(0.2) and lr_factor(9, cos, 5) == pytest.approx(0.2)
    lin = OptimConfig(lr=1.0, lr_schedule="linear", warmup_steps=1)
    # after 1 warmup step, 4 decay steps: 1, 2/3, 1/3, 0
    assert [lr_factor(i, lin, 5) for i in range(5)] == pytest.approx([0.5, 1.0, 2 / 3, 1 / 3, 0.0])


def test_bad_schedule_settings_are_rejected():
    with pytest.raises(ValueError, match="lr_schedule"):
        OptimConfig(lr_schedule="step")
    with pytest.raises(ValueError, match="mini_batches"):
        OptimConfig(mini_batches=0)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        OptimConfig(min_lr_ratio=1.5)


def test_epochs_times_mini_batches_optimizer_steps_and_the_lr_follows_the_schedule():
    optim = OptimConfig(lr=1e-2, lr_schedule="linear", ppo_epochs=2, mini_batches=3, warmup_steps=0)
    learner = Learner(_model(), AlgoConfig(), optim, total_steps=12)
    lrs = []
    step = learner._optimizer_step

    def capture():
        lrs.append(learner.optimizer.param_groups[0]["lr"])
        return step()

    learner._optimizer_step = capture
    m = learner.update(_batch(seed=2))
    assert m.optimizer_steps == 6 and learner.step == 6 and m.step == 6
    assert lrs == pytest.approx([1e-2 * (1 - i / 11) for i in range(6)])
    m2 = learner.update(_batch(seed=4))
    assert m2.optimizer_steps == 6 and learner.step == 12
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_a_mini_batch_step_is_the_step_on_those_rows_alone():
    # reinforce advantages are the raw rewards, so a sub-batch has the same advantages as inside the
    # whole batch: the first mini-batch's gradient must equal a one-mini-batch learner's on its rows.
    # fp64 models: the two runs pad and order those rows differently, so fp32 kernels would differ by
    # vendor-dependent ~1e-7; in fp64 by ~1e-16, far inside 1e-12 (|gradients| ≲ 0.2).
    batch = _batch(seed=6)
    algo = AlgoConfig(estimator="reinforce")
    learner = Learner(_model(dtype=torch.float64), algo, OptimConfig(lr=1e-2, mini_batches=2))
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(0)).tolist()
    first = order[0::2]
    grads: list[list[torch.Tensor]] = []
    step = learner._optimizer_step

    def capture(step=step, grads=grads, learner=learner):
        grads.append([p.grad.detach().clone() for p in learner.policy.parameters()])
        return step()

    learner._optimizer_step = capture
    learner.update(batch)
    ref = Learner(_model(dtype=torch.float64), algo, OptimConfig(lr=1e-2))
    ref_grads: list[list[torch.Tensor]] = []
    ref_step = ref._optimizer_step

    def capture_ref():
        ref_grads.append([p.grad.detach().clone() for p in ref.policy.parameters()])
        return ref_step()

    ref._optimizer_step = capture_ref
    ref.update(batch.select(first, trim=False))
    assert len(grads) == 2 and len(ref_grads) == 1
    for a, b in zip(grads[0], ref_grads[0], strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(grads[1], ref_grads[0], strict=True))


def test_recomputed_old_logp_makes_the_first_ratio_one():
    batch = _batch(seed=7)
    # engine log-probs far from the learner's: the ratio is clipped almost everywhere
    stale = type(batch)(**{**batch.__dict__, "old_logp": batch.old_logp * 0.0})
    m_stale = Learner(_model(), AlgoConfig(), OptimConfig(lr=1e-3)).update(stale)
    # fp64 policy: the recomputed old log-probs, kept as fp32 by the learner, are the new ones rounded
    # once, d ≤ 2⁻²⁴·|logp| ≤ 2⁻²⁴·(ln 12 + 2) ≈ 4e-7 (|logits| < 1) whatever the kernels, and approx_kl,
    # the mean of d²/2, ≤ 1e-13
    fresh = AlgoConfig(recompute_old_logp=True, aem=AEMConfig(enabled=True))
    m_fresh = Learner(_model(dtype=torch.float64), fresh, OptimConfig(lr=1e-3)).update(stale)
    assert m_stale.approx_kl > 0.5
    assert m_fresh.approx_kl == pytest.approx(0.0, abs=1e-10)
    assert m_fresh.clipfrac_low == 0.0 and m_fresh.clipfrac_high == 0.0


def test_gradient_checkpointing_gives_the_same_gradient():
    batch = _batch(seed=8)
    grads = []
    for ckpt in (False, True):  # fp64: the recomputed forward need not use the same kernels
        optim = OptimConfig(lr=1e-2, gradient_checkpointing=ckpt)
        learner = Learner(_model(dtype=torch.float64), AlgoConfig(), optim)
        out: list[torch.Tensor] = []
        step = learner._optimizer_step

        def capture(step=step, out=out, learner=learner):
            out.extend(p.grad.detach().clone() for p in learner.policy.parameters())
            return step()

        learner._optimizer_step = capture
        learner.update(batch)
        grads.append(out)
        assert learner.policy.is_activation_checkpointing == ckpt
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)
