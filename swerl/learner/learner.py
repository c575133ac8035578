"""The learner: one algorithm over a backend strategy (`swerl.learner.backend`): plain torch
(`TorchBackend`) or DeepSpeed ZeRO 0–3 (`swerl.learner.ds_learner.DeepSpeedBackend`), either of them
with a LoRA policy (`swerl.learner.lora`).

One `update(batch)` reads top to bottom as prepare → optimise → metrics:
  prepare: rewards (+ DAPO overlong shaping) → group advantages (grpo | drgrpo | rloo | reinforce)
    → DAPO filter (drop groups whose raw rewards are all equal)
    → pre-update policy pass (no grad) when needed: entropies for AEM α per turn (α is normalised
      over whole rollout groups, which may span micro-batches) and/or the learner's own old log-probs
    → reference pass (no grad) for ActFocus energy and the KL's ref log-probs, when either is on;
  optimise: ppo_epochs × mini_batches optimizer steps; in each, per micro-batch: policy forward →
    clipped policy loss with ActFocus weights (+ kl_coef · KL), scaled so the sum over micro-batches
    is exactly the mini-batch loss → backward; then grad clip → optimizer step → LR schedule step;
  metrics: this rank's, then (a collective backend) combined over the ranks.
Log-probs, entropy and energy come from `swerl.algo.token_statistics` on the final hidden states
and the LM head weight: the (tokens, vocab) logits are never materialised, and the head runs only at
the tokens in the loss (`loss_positions`); every stat is 0 elsewhere and is read under that mask.

Data parallelism is in the algorithm only through the backend's collectives: loss scales use global
token / sequence counts, every rank runs the same number of forwards (ZeRO-3 gathers parameters
collectively in each, so ranks with fewer micro-batches run empty ones), and ActFocus's energy
z-score is over every rank's action tokens.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from swerl import algo
from swerl.algo.diagnostics import GroupEnergies, group_energies
from swerl.heap import release_free_memory
from swerl.learner.backend import LearnerBackend, loss_positions, sequence_stats
from swerl.learner.batch import Batch, pack_micro_batches
from swerl.learner.combine import combine_rank_metrics, energy_metrics
from swerl.learner.config import AlgoConfig, OptimConfig
from swerl.learner.lora import is_peft
from swerl.learner.metrics import UpdateMetrics
from swerl.learner.torch_backend import TorchBackend
from swerl.learner.weights import WeightBucket, WeightMeta
from swerl.structs import Span

_NAN = float("nan")


def _mean(x: Tensor, where: Tensor) -> float:
    n = int(where.sum())
    return float(torch.where(where, x, 0).sum() / n) if n else _NAN


@dataclass(frozen=True)
class _Prepared:
    """What the optimizer steps and the metrics read of one batch, after the no-grad passes."""

    dummy: Batch
    """What an empty micro-batch slot forwards (collectives stay in step with the other ranks)."""
    kept: Batch
    """The rows that survive the DAPO filter, (K, T)."""
    adv: Tensor
    """(K,) advantages of the kept rows."""
    mask: Tensor
    span: Tensor
    turn: Tensor
    """(K, T − 1) loss mask, span and turn index: entry t is about token t + 1."""
    micro: list[list[int]]
    """Micro-batches of the kept rows (the no-grad passes')."""
    old_logp: Tensor
    """(K, T − 1) old log-probs of the ratio: the engine's, or the learner's own when recomputed."""
    token_adv: Tensor
    """(K,) broadcast over tokens, or (K, T − 1) with AEM."""
    alpha: Tensor
    """AEM α per turn (1 without AEM)."""
    aem_in_loss_pass: bool
    """AEM's entropies come from the one loss pass (one micro-batch, one optimizer step)."""
    ref: algo.TokenStats | None
    """The reference pass (KL / ActFocus)."""
    actfocus_w: Tensor | None
    weights: Tensor | None
    """(K, T − 1) per-token factors of the policy-gradient term: ActFocus × rollout IS."""
    mismatch: Any
    """Engine vs learner log-prob mismatch, when the learner recomputes the old log-probs."""


@dataclass(frozen=True)
class _PolicyPass:
    """What the pre-update policy pass settles (see `Learner._policy_pass`)."""

    old_logp: Tensor
    token_adv: Tensor
    alpha: Tensor
    aem_in_loss_pass: bool
    mismatch: Any
    is_weights: Tensor | None
    """(K, T − 1) rollout_is weights, when the correction is on."""


@dataclass(frozen=True)
class _Optimised:
    """What the optimizer steps of one update report: per-step sums and counts."""

    steps: int
    micro_batches: int
    sums: dict[str, float]
    token_metrics: dict[str, float]
    alpha: Tensor


class Learner:
    """Policy + frozen reference on a backend; `update(batch)` is one batch of rollouts →
    `ppo_epochs × mini_batches` optimizer steps. On a collective backend (DeepSpeed) there is one
    instance per rank and every method is called on every rank."""

    def __init__(self, model: Any, algo_cfg: AlgoConfig, optim: OptimConfig, *, device: str = "cpu",
                 total_steps: int | None = None, reference: Any = None) -> None:
        """`model`: a `LearnerBackend` (see `swerl.learner.factory.make_learner`), or a transformers
        causal LM (peft-wrapped for LoRA) to train on plain torch: `TorchBackend(model, ...)` with
        `device`, `total_steps` and `reference`."""
        if isinstance(model, LearnerBackend):
            if (device, total_steps, reference) != ("cpu", None, None):
                raise ValueError("device / total_steps / reference are the backend's: pass them to it")
            self.backend: LearnerBackend = model
        else:
            self.backend = TorchBackend(model, algo_cfg, optim, device=device, total_steps=total_steps,
                                        reference=reference)
        self.algo = algo_cfg
        self.optim_cfg = optim
        self.shuffle = torch.Generator().manual_seed(0)
        self.step = 0

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def policy(self) -> Any:
        return self.backend.policy

    @property
    def reference(self) -> Any:
        return self.backend.reference

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.backend.optimizer

    @property
    def world_size(self) -> int:
        """Data-parallel ranks whose gradients are averaged."""
        return self.backend.world.size

    @property
    def lora(self) -> bool:
        """The policy is peft-wrapped: only its adapters train."""
        return is_peft(self.policy)

    # ---- one update ---------------------------------------------------------------------------------

    def update(self, batch: Batch) -> UpdateMetrics:
        """One batch of rollouts (on a collective backend: this rank's whole rollout groups, see
        `dist.shard_rows_by_group`) → optimizer steps; see the module docstring for the order.
        Returns metrics of the whole batch (the same on every rank)."""
        t0 = time.perf_counter()
        base, prep = self._prepare(batch)
        done = self._optimise(prep) if prep is not None else None
        group_stats = None  # per group: mean action / reasoning energy, reward variance
        if prep is not None and prep.ref is not None:
            action = prep.mask & (prep.span == Span.ACTION)
            reasoning = prep.mask & (prep.span == Span.REASONING)
            kept = prep.kept
            group_stats = group_energies(prep.ref.energy, action, reasoning, kept.rewards, kept.group)
        if prep is None or done is None or done.steps == 0:
            m = self._skipped(base, t0)
        else:
            m = self._metrics(base, prep, done, group_stats, t0)
        self.backend.settle()
        release_free_memory()  # the update's activations are freed: give their pages back (swerl.heap)
        if not self.backend.world.collective:
            return m
        parts = self.backend.all_gather((m, group_stats))
        return combine_rank_metrics([p[0] for p in parts], [p[1] for p in parts])

    # ---- prepare ------------------------------------------------------------------------------------

    def _on_device(self, batch: Batch) -> Batch:
        return Batch(**{k: v.to(self.device) for k, v in batch.__dict__.items()})

    def _advantages(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """(shaped rewards, advantages, rows kept) of the batch, (B,) each: advantages over whole
        groups, before any filtering; then the DAPO filter."""
        cfg = self.algo
        shaped = batch.rewards
        if cfg.overlong.enabled:
            shaped = batch.rewards + algo.overlong_penalty(batch.loss_mask.sum(1), cfg.overlong.max_len,
                                                           cfg.overlong.buffer_len, cfg.overlong.factor)
        adv = algo.group_advantages(shaped, batch.group, cfg.estimator)
        if cfg.dapo_filter:
            keep = algo.dapo_keep_mask(batch.rewards, batch.group)
        else:
            keep = torch.ones_like(batch.loss_mask.bool()[:, 0])
        return shaped, adv, keep

    def _prepare(self, batch: Batch) -> tuple[dict[str, Any], _Prepared | None]:
        """(the metrics known before any step, the inputs of the optimizer steps or None when no rank
        has a token to train): advantages, the DAPO filter and the no-grad passes."""
        batch = self._on_device(batch)
        dummy = batch.select([0])
        shaped, adv, keep = self._advantages(batch)
        keep_rows = keep.nonzero().squeeze(1).tolist()
        kept = batch.select(keep_rows)  # (K, T)
        adv_k = adv[keep_rows] if keep_rows else adv[:0]
        mask = loss_positions(kept)  # (K, T − 1): about token t + 1
        span = kept.span[:, 1:]
        turn = kept.turn_index[:, 1:]
        n_tokens = int(mask.sum())
        base = dict(episodes=batch.size, episodes_kept=len(keep_rows), tokens=n_tokens,
                    reward_mean=float(batch.rewards.mean()), reward_shaped_mean=float(shaped.mean()),
                    advantage_mean=float(adv_k.mean()) if keep_rows else _NAN,
                    advantage_abs_mean=float(adv_k.abs().mean()) if keep_rows else _NAN,
                    lr=float(self.optimizer.param_groups[0]["lr"]))
        if self.backend.sum_over_ranks(float(n_tokens)) == 0:
            return base, None
        micro = pack_micro_batches(kept.lengths, self.optim_cfg.micro_batch_tokens) if keep_rows else []
        pre = self._policy_pass(kept, micro, adv_k, mask, turn, dummy)
        ref, actfocus_w = self._reference_pass(kept, micro, span, mask, dummy)
        weights = actfocus_w
        if pre.is_weights is not None:  # both are per-token factors of the policy-gradient term
            weights = pre.is_weights if weights is None else weights * pre.is_weights
        return base, _Prepared(dummy=dummy, kept=kept, adv=adv_k, mask=mask, span=span, turn=turn,
                               micro=micro, old_logp=pre.old_logp, token_adv=pre.token_adv, alpha=pre.alpha,
                               aem_in_loss_pass=pre.aem_in_loss_pass, ref=ref, actfocus_w=actfocus_w,
                               weights=weights, mismatch=pre.mismatch)

    def _policy_pass(self, kept: Batch, micro: list[list[int]], adv: Tensor, mask: Tensor, turn: Tensor,
                     dummy: Batch) -> _PolicyPass:
        """The pre-update policy pass: entropies for AEM (α is normalised over whole groups, so every
        entropy is needed before the first loss) and/or the learner's own old log-probs. With one
        micro-batch and one optimizer step the loss pass has the same numbers: no sweep. Each rank
        holds whole groups, so that holds per rank; the ranks agree on it (a ZeRO-3 forward is a
        collective, so all take the pre-pass or none does)."""
        cfg = self.algo
        single_step = self.optim_cfg.ppo_epochs == 1 and self.optim_cfg.mini_batches == 1
        old_logp = kept.old_logp[:, 1:]  # (K, T − 1)
        token_adv: Tensor = adv
        mismatch = None
        is_weights = None
        alpha = torch.ones(1, device=self.device)
        aem_in_loss_pass = (cfg.aem.enabled and single_step and not cfg.recompute_old_logp
                            and self.backend.max_over_ranks(len(micro)) == 1)
        if (cfg.aem.enabled and not aem_in_loss_pass) or cfg.recompute_old_logp:
            self.policy.eval()
            pre = self._no_grad_pass(self.policy, kept, micro, compute_entropy=cfg.aem.enabled, dummy=dummy)
            if cfg.aem.enabled:
                token_adv, alpha = algo.aem_advantages(adv, kept.group, pre.entropy, turn, mask, cfg.aem.lam)
            if cfg.recompute_old_logp:
                engine_logp = old_logp
                old_logp = torch.where(mask, pre.logp, 0.0)
                # how far the engine's sampling distribution is from the learner's, and (rollout_is)
                # its correction
                isc = cfg.rollout_is
                isw = algo.importance_weights(old_logp, engine_logp, mask, level=isc.level,
                                              mode="truncate" if isc.mode == "off" else isc.mode, cap=isc.cap,
                                              lower=isc.lower or None)
                mismatch = algo.is_metrics(isw, old_logp, engine_logp, mask, level=isc.level)
                if isc.mode != "off":
                    is_weights = isw.weights
        return _PolicyPass(old_logp=old_logp, token_adv=token_adv, alpha=alpha,
                           aem_in_loss_pass=aem_in_loss_pass, mismatch=mismatch, is_weights=is_weights)

    def _reference_pass(self, kept: Batch, micro: list[list[int]], span: Tensor, mask: Tensor,
                        dummy: Batch) -> tuple[algo.TokenStats | None, Tensor | None]:
        """(reference stats, ActFocus weights): energy for ActFocus, log-probs for the KL."""
        ref = None
        if self.reference is not None:
            ref = self._no_grad_pass(self.reference, kept, micro, compute_entropy=False, dummy=dummy)
        if not self.algo.actfocus.enabled:
            return ref, None
        assert ref is not None
        return ref, self._actfocus_weights(ref.energy, span, mask)

    def _stats(self, model: Any, mb: Batch, *, compute_entropy: bool = True) -> algo.TokenStats:
        """`model` (the policy or the reference) on `mb`, through the backend."""
        return self.backend.forward(model, mb, compute_entropy=compute_entropy)

    def _padded(self, micro: list[list[int]]) -> list[list[int] | None]:
        """`micro` followed by empty slots (None) up to the largest count over ranks."""
        return [*micro, *([None] * (self.backend.max_over_ranks(len(micro)) - len(micro)))]

    @torch.no_grad()
    def _no_grad_pass(self, model: Any, kept: Batch, micro: list[list[int]], compute_entropy: bool, *,
                      dummy: Batch) -> algo.TokenStats:
        """TokenStats of the whole kept batch, (K, T − 1) (0 off the loss mask), computed micro-batch by
        micro-batch."""
        k, width = kept.input_ids.shape
        logp = torch.zeros(k, width - 1, device=self.device)
        ent = torch.zeros_like(logp)
        energy = torch.zeros_like(logp)
        for rows in self._padded(micro):
            if rows is None:  # keep collective forwards in step with the other ranks
                self._stats(model, dummy, compute_entropy=False)
                continue
            mb = kept.select(rows)
            s = self._stats(model, mb, compute_entropy=compute_entropy)
            idx = torch.as_tensor(rows, device=self.device)
            w = s.logp.shape[1]
            logp[idx, :w] = s.logp.float()
            energy[idx, :w] = s.energy.float()
            if s.entropy is not None:
                ent[idx, :w] = s.entropy.float()
        return algo.TokenStats(logp, ent if compute_entropy else None, energy)

    def _actfocus_weights(self, energy: Tensor, span: Tensor, mask: Tensor) -> Tensor:
        """ActFocus weights of this rank's kept rows. The energy z-score is over all action tokens of
        the batch, so with several ranks it is computed over every rank's tokens."""
        af = self.algo.actfocus
        if self.world_size == 1:
            return algo.actfocus_weights(energy, span, mask, af.alpha, af.beta)
        # append the other ranks' action energies as one extra row, so the algo function itself
        # computes the global statistics
        action = mask & (span == Span.ACTION)
        mine = energy[action].detach().double().cpu()
        rank = self.backend.world.rank
        others = [e for r, e in enumerate(self.backend.all_gather(mine)) if r != rank]
        extra = torch.cat(others).to(device=energy.device, dtype=energy.dtype)
        k, width = energy.shape
        full = max(width, extra.numel())
        e = torch.zeros(k + 1, full, dtype=energy.dtype, device=energy.device)
        sp = torch.zeros(k + 1, full, dtype=span.dtype, device=span.device)
        mk = torch.zeros(k + 1, full, dtype=torch.bool, device=mask.device)
        e[:k, :width], sp[:k, :width], mk[:k, :width] = energy, span, mask
        e[k, :extra.numel()], sp[k, :extra.numel()], mk[k, :extra.numel()] = extra, Span.ACTION, True
        return algo.actfocus_weights(e, sp, mk, af.alpha, af.beta)[:k, :width]

    # ---- optimise -----------------------------------------------------------------------------------

    def _mini_batches(self, k: int) -> list[list[int]]:
        """Row indices of each mini-batch of one epoch: all rows in order for one mini-batch, else a
        seeded shuffle split into `mini_batches` near-equal parts. Empty parts are kept so that every
        rank steps `mini_batches` times (one with no tokens on any rank is skipped)."""
        n = self.optim_cfg.mini_batches
        if n == 1:
            return [list(range(k))]
        order = torch.randperm(k, generator=self.shuffle).tolist()
        return [order[i::n] for i in range(n)]

    def _optimise(self, prep: _Prepared) -> _Optimised:
        """epochs × mini-batches optimizer steps, each over its micro-batches' backward passes."""
        ocfg = self.optim_cfg
        kept, mask = prep.kept, prep.mask
        aem = (prep.token_adv, prep.alpha)
        horizon = self.backend.max_over_ranks(mask.shape[1])
        self.policy.train()
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        tok_metrics = {"clipfrac_low": 0.0, "clipfrac_high": 0.0, "clipfrac_dual": 0.0, "approx_kl": 0.0}
        steps = 0
        n_micro = 0
        for _epoch in range(ocfg.ppo_epochs):
            for mini in self._mini_batches(kept.size):
                mini_mask = mask[mini] if mini else mask[:0]
                mini_tok = self.backend.sum_over_ranks(float(mini_mask.sum()))
                mini_seqs = self.backend.sum_over_ranks(float((mini_mask.sum(1) > 0).sum()))
                if mini_tok == 0:
                    continue
                sub = [[mini[i] for i in part] for part in pack_micro_batches(kept.lengths[mini],
                                                                           ocfg.micro_batch_tokens)]
                slots = self._padded(sub)
                self.backend.begin_accumulation(len(slots))
                for rows in slots:
                    n_micro += 1
                    if rows is None:  # an empty slot: a zero loss keeps collectives in step
                        s = self._stats(self.policy, prep.dummy, compute_entropy=False)
                        self.backend.backward(s.logp.sum() * 0.0)
                        continue
                    aem, parts = self._micro_batch(prep, rows, aem, mini_tok, mini_seqs, horizon)
                    for k, v in parts.items():
                        if k in sums:
                            sums[k] += v
                        else:
                            tok_metrics[k] += v
                sums["grad_norm"] += self._optimizer_step()
                steps += 1
                self.step += 1
        return _Optimised(steps=steps, micro_batches=n_micro, sums=sums, token_metrics=tok_metrics,
                          alpha=aem[1])

    def _micro_batch(self, prep: _Prepared, rows: list[int], aem: tuple[Tensor, Tensor], mini_tok: float,
                     mini_seqs: float, horizon: int) -> tuple[tuple[Tensor, Tensor], dict[str, float]]:
        """Forward, loss and backward of the kept rows `rows`, one micro-batch of a mini-batch of
        `mini_tok` tokens / `mini_seqs` sequences over all ranks; the loss is scaled so that the sum
        over micro-batches (and the average over ranks) is the mini-batch's aggregate loss. `aem`:
        (token advantages, α), which the loss pass itself sets when it is AEM's only pass. Returns
        `aem` and this micro-batch's shares of the step's metrics."""
        cfg = self.algo
        kept, mask = prep.kept, prep.mask
        ws = self.world_size
        token_adv, alpha = aem
        mb = kept.select(rows)
        idx = torch.as_tensor(rows, device=self.device)
        s = self._stats(self.policy, mb)
        w = s.logp.shape[1]
        if prep.aem_in_loss_pass:  # the one micro-batch holds every row (in packing order)
            ent = torch.zeros(mask.shape, device=self.device)
            ent[idx, :w] = s.entropy.detach().float()
            token_adv, alpha = algo.aem_advantages(prep.adv, kept.group, ent, prep.turn, mask, cfg.aem.lam)
        mb_mask = loss_positions(mb)
        mb_tok = int(mb_mask.sum())
        if mb_tok == 0:
            self.backend.backward(s.logp.sum() * 0.0)
            return (token_adv, alpha), {}
        mb_adv = token_adv[idx] if token_adv.ndim == 1 else token_adv[idx, :w]
        mb_w = prep.weights[idx, :w] if prep.weights is not None else None
        agg = cfg.loss_agg
        if agg == "token-mean":
            scale, mb_agg = mb_tok / mini_tok, agg
        else:
            scale, mb_agg = int((mb_mask.sum(1) > 0).sum()) / mini_seqs, agg
            if agg == "seq-mean-token-sum-norm":  # the constant horizon is the batch's T
                scale, mb_agg = scale / horizon, "seq-mean-token-sum"
        scale *= ws  # undoes the ranks' gradient averaging
        pg, m = algo.policy_loss(s.logp, prep.old_logp[idx, :w], mb_adv, mb_mask, weights=mb_w,
                                 clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip,
                                 agg=mb_agg)
        loss = pg * scale
        frac = mb_tok / mini_tok * ws
        parts: dict[str, float] = {}
        if cfg.kl.coef > 0:
            assert prep.ref is not None
            kl_tok = algo.kl_penalty(s.logp, prep.ref.logp[idx, :w], cfg.kl.kind)
            kl = algo.aggregate_loss(kl_tok, mb_mask, "token-mean") * frac
            loss = loss + cfg.kl.coef * kl
            parts["kl"] = float(kl.detach())
        self.backend.backward(loss)
        parts.update(loss=float(loss.detach()), pg=float(pg.detach()) * scale,
                     entropy=float(torch.where(mb_mask, s.entropy, 0).sum()))
        for k in ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"):
            parts[k] = float(m[k]) * frac
        return (token_adv, alpha), parts

    def _optimizer_step(self) -> float:
        """One optimizer step; the gradient norm before clipping. (A seam tests wrap to read the
        accumulated gradients.)"""
        return self.backend.step()

    # ---- metrics ------------------------------------------------------------------------------------

    def _metrics(self, base: dict[str, Any], prep: _Prepared, done: _Optimised,
                 group_stats: GroupEnergies | None, t0: float) -> UpdateMetrics:
        """This rank's metrics: per optimizer step averages of the losses (a rank's share of each
        mini-batch: the sum over ranks is the mean), statistics of its kept episodes."""
        cfg = self.algo
        steps, ws = done.steps, self.world_size
        sums = done.sums
        n_tokens = base["tokens"]
        passes = self.optim_cfg.ppo_epochs
        mask, span, ref, actfocus_w = prep.mask, prep.span, prep.ref, prep.actfocus_w
        action = mask & (span == Span.ACTION)
        reasoning = mask & (span == Span.REASONING)
        corr: dict[str, Any] = {}
        if group_stats is not None:
            corr = energy_metrics(group_stats)
        if actfocus_w is not None:
            w_tok = actfocus_w[action | reasoning]
            if w_tok.numel():
                corr.update(actfocus_weight_min=float(w_tok.min()), actfocus_weight_max=float(w_tok.max()))
        mm = prep.mismatch
        if mm is not None:
            corr.update(is_ratio_mean=mm.ratio_mean, is_ratio_max=mm.ratio_max,
                        is_capped_fraction=mm.capped_fraction, mismatch_kl_k1=mm.mismatch_k1,
                        mismatch_kl_k3=mm.mismatch_k3)
        alpha = done.alpha
        dt = time.perf_counter() - t0
        return UpdateMetrics(
            step=self.step, skipped=False, micro_batches=done.micro_batches, optimizer_steps=steps, **base,
            loss=sums["loss"] / steps / ws, pg_loss=sums["pg"] / steps / ws,
            kl=sums["kl"] / steps / ws if cfg.kl.coef > 0 else _NAN,
            grad_norm=sums["grad_norm"] / steps, entropy=sums["entropy"] / max(1, n_tokens * passes),
            **{k: v / steps / ws for k, v in done.token_metrics.items()},
            aem_alpha_mean=float(alpha.mean()), aem_alpha_min=float(alpha.min()),
            aem_alpha_max=float(alpha.max()),
            actfocus_weight_action=_mean(actfocus_w, action) if actfocus_w is not None else 1.0,
            actfocus_weight_reasoning=_mean(actfocus_w, reasoning) if actfocus_w is not None else 1.0,
            action_token_share=float(action.sum()) / n_tokens if n_tokens else _NAN,
            energy_action=_mean(ref.energy, action) if ref is not None else _NAN,
            energy_reasoning=_mean(ref.energy, reasoning) if ref is not None else _NAN,
            update_s=dt, tokens_per_s=float(prep.kept.lengths.sum()) * passes / dt, **corr,
        )

    def _skipped(self, base: dict[str, Any], t0: float) -> UpdateMetrics:
        dt = time.perf_counter() - t0
        return UpdateMetrics(
            step=self.step, skipped=True, micro_batches=0, optimizer_steps=0, **base, loss=0.0, pg_loss=0.0,
            kl=_NAN, clipfrac_low=0.0, clipfrac_high=0.0, clipfrac_dual=0.0, approx_kl=0.0, grad_norm=0.0,
            entropy=_NAN, aem_alpha_mean=1.0, aem_alpha_min=1.0, aem_alpha_max=1.0,
            actfocus_weight_action=1.0, actfocus_weight_reasoning=1.0, action_token_share=_NAN,
            energy_action=_NAN, energy_reasoning=_NAN, update_s=dt, tokens_per_s=0.0)

    # ---- weights, checkpoints, export ---------------------------------------------------------------

    def policy_state_dict(self, *, rank0_only: bool = False) -> dict[str, Tensor]:
        """Full policy weights on CPU under plain transformers names (LoRA merged in), for the rollout
        engine's `update_weights`. Collective on DeepSpeed: call it on every rank; `rank0_only`: the
        other ranks take part but get {}."""
        return self.backend.policy_state_dict(rank0_only=rank0_only)

    def iter_weight_buckets(self, bucket_bytes: int, *,
                            device: torch.device | str = "cpu") -> Iterator[WeightBucket]:
        """The policy's weights in buckets of at most `bucket_bytes` (a larger weight alone; a tied weight
        once), copied to `device` one module at a time, for weight sync in memory. Collective on
        DeepSpeed (ZeRO-3 gathers module by module): every rank drains it."""
        return self.backend.iter_weight_buckets(bucket_bytes, device=device)

    def weight_meta(self) -> list[WeightMeta]:
        """Name, dtype and shape of each weight `iter_weight_buckets` yields, in order, copying nothing."""
        return self.backend.weight_meta()

    def export_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
        """Write the policy as a plain HF checkpoint (+ the tokenizer when given), atomically; on
        DeepSpeed rank 0 writes it (call on every rank)."""
        return self.backend.export_hf(directory, tokenizer)

    def _rank_state(self) -> dict[str, Any]:
        """This process's share of an exact resume: the step and the RNG states."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                               "shuffle": self.shuffle.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {"step": self.step, "rng": rng}

    def _load_rank_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        rng = state.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "python" in rng:
            random.setstate(rng["python"])
        if "shuffle" in rng:
            self.shuffle.set_state(rng["shuffle"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: policy, optimizer, LR schedule, step, RNG states (plain
        torch; a DeepSpeed learner's state is partitioned: use `save_checkpoint`)."""
        return {**self.backend.state_dict(), **self._rank_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.backend.load_state_dict(state)
        self._load_rank_state(state)

    def save_checkpoint(self, run_dir: str | os.PathLike[str], step: int,
                        extra: dict[str, Any] | None = None, *, keep_last: int = 0) -> Path:
        """Write checkpoint `step` of `run_dir` atomically: this learner's state plus `extra` (the loop's
        own state, e.g. its RNGs and step). A distributed learner writes one shard per rank (call it on
        every rank). Keeps the newest `keep_last` checkpoints when > 0; returns the directory."""
        return self.backend.save_checkpoint(run_dir, step, self._rank_state(), extra or {},
                                            keep_last=keep_last)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore from a checkpoint directory written by `save_checkpoint`; returns its `extra`."""
        rank_state, extra = self.backend.load_checkpoint(path)
        self._load_rank_state(rank_state)
        return extra


__all__ = ["Learner", "LearnerBackend", "TorchBackend", "sequence_stats"]
