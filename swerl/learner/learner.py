"""The learner on plain single-process torch: policy + frozen reference, one update per call.

One `update(batch)`:
    rewards (+ DAPO overlong shaping) → group advantages (grpo | drgrpo | rloo | reinforce)
    → DAPO filter (drop groups whose raw rewards are all equal)
    → pre-update policy pass (no grad) when needed: entropies for AEM α per turn (α is normalised
      over whole rollout groups, which may span micro-batches) and/or the learner's own old log-probs
    → reference pass (no grad) for ActFocus energy and the KL's ref log-probs, when either is on
    → ppo_epochs × mini_batches optimizer steps; in each, per micro-batch: policy forward → clipped
      policy loss with ActFocus weights (+ kl_coef · KL), scaled so the sum over micro-batches is
      exactly the mini-batch loss → backward; then grad clip → optimizer step → LR schedule step.
Log-probs, entropy and energy come from `swerl.algo.token_statistics` on the final hidden states
and the LM head weight: the (tokens, vocab) logits are never materialised.

Seams for a distributed learner (`swerl.learner.ds_learner`): `_backward`, `_optimizer_step` are the
only places that touch autograd and the optimizer; `_sum_over_ranks` / `_max_over_ranks` /
`world_size` make the loss scale global and keep every rank's forward count equal (ZeRO-3);
`state_dict` / `load_state_dict` / `policy_state_dict` / `export_hf` move the weights.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from swerl import algo
from swerl.learner.batch import Batch, pack_micro_batches
from swerl.learner.config import AlgoConfig, OptimConfig, lr_factor
from swerl.learner.metrics import energy_reward_correlation, group_energy_reward_stats
from swerl.structs import UpdateMetrics

_NAN = float("nan")


def sequence_stats(model: Any, batch: Batch, *, chunk_size: int, temperature: float = 1.0,
                   compute_entropy: bool = True) -> algo.TokenStats:
    """Per-token log-prob, entropy and energy of `batch` under a causal LM (Qwen2-style: `model.model`
    gives the final hidden states, `model.lm_head.weight` the output embedding).

    Returns TokenStats of shape (B, T − 1): entry t is about token t + 1 (predicted from position t).
    """
    ids = batch.input_ids
    pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    hidden = model.model(input_ids=ids, attention_mask=batch.attention_mask, position_ids=pos,
                         use_cache=False).last_hidden_state  # (B, T, H)
    return algo.token_statistics(hidden[:, :-1], model.lm_head.weight, ids[:, 1:], chunk_size=chunk_size,
                                 temperature=temperature, compute_entropy=compute_entropy)


def _mean(x: Tensor, where: Tensor) -> float:
    n = int(where.sum())
    return float(torch.where(where, x, 0).sum() / n) if n else _NAN


class Learner:
    """Policy + frozen reference on one device; `update(batch)` is one batch of rollouts →
    `ppo_epochs × mini_batches` optimizer steps."""

    def __init__(self, model: Any, algo_cfg: AlgoConfig, optim: OptimConfig, *, device: str = "cpu",
                 total_steps: int | None = None, reference: Any = None) -> None:
        """`model`: a transformers causal LM (the policy, trained in place). The reference model is a
        frozen copy of it taken now (or `reference` when given), kept only when KL or ActFocus needs
        it. `total_steps`: optimizer steps of the whole run, the horizon of a decaying LR schedule."""
        self.algo = algo_cfg
        self.optim_cfg = optim
        self.device = torch.device(device)
        self.total_steps = total_steps
        if optim.gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.policy = model.to(self.device)
        self.reference = None
        if algo_cfg.needs_reference:
            ref = reference if reference is not None else copy.deepcopy(model)
            self.reference = ref.to(self.device).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.policy.parameters() if p.requires_grad], lr=optim.lr, betas=optim.betas,
            eps=optim.eps, weight_decay=optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: lr_factor(i, optim, total_steps))
        self.shuffle = torch.Generator().manual_seed(0)
        self.step = 0

    # ---- the seams a distributed (DeepSpeed) learner overrides ---------------------------------------

    def _backward(self, loss: Tensor) -> None:
        loss.backward()

    def _optimizer_step(self) -> float:
        """Clip, step (optimizer and LR schedule), zero grads; returns the gradient norm before clipping."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _sum_over_ranks(self, value: float) -> float:
        """Sum of `value` over data-parallel ranks (one process: itself). The loss of a rank is scaled by
        global token / sequence counts so that averaging gradients over ranks gives the full-batch loss."""
        return value

    def _max_over_ranks(self, value: int) -> int:
        """Max of `value` over ranks: every rank must run the same number of forward passes (ZeRO-3
        gathers parameters collectively in each), so ranks with fewer micro-batches run empty ones."""
        return value

    @property
    def world_size(self) -> int:
        """Data-parallel ranks whose gradients are averaged (1 here)."""
        return 1

    def _begin_accumulation(self, micro_batches: int) -> None:
        """Called before the backward passes of one optimizer step with their number (every slot of
        `_padded`, empty ones included, runs `_backward` once): DeepSpeed marks the last one as the
        gradient-accumulation boundary, where gradients are reduced over ranks."""

    def _actfocus_weights(self, energy: Tensor, span: Tensor, mask: Tensor) -> Tensor:
        """ActFocus weights of this rank's kept rows. The energy z-score is over all action tokens of the
        batch, so a data-parallel learner computes it over every rank's tokens."""
        return algo.actfocus_weights(energy, span, mask, self.algo.actfocus.alpha, self.algo.actfocus.beta)

    # ---- one update ---------------------------------------------------------------------------------

    def _stats(self, model: Any, mb: Batch, *, compute_entropy: bool = True) -> algo.TokenStats:
        return sequence_stats(model, mb, chunk_size=self.optim_cfg.chunk_size,
                              temperature=self.algo.temperature, compute_entropy=compute_entropy)

    def _padded(self, micro: list[list[int]]) -> list[list[int] | None]:
        """`micro` followed by empty slots (None) up to the largest count over ranks."""
        return [*micro, *([None] * (self._max_over_ranks(len(micro)) - len(micro)))]

    @torch.no_grad()
    def _no_grad_pass(self, model: Any, kept: Batch, micro: list[list[int]],
                      compute_entropy: bool) -> algo.TokenStats:
        """TokenStats of the whole kept batch, (K, T − 1), computed micro-batch by micro-batch."""
        k, width = kept.input_ids.shape
        logp = torch.zeros(k, width - 1, device=self.device)
        ent = torch.zeros_like(logp)
        energy = torch.zeros_like(logp)
        for rows in self._padded(micro):
            if rows is None:  # keep collective forwards in step with the other ranks
                self._stats(model, self._dummy, compute_entropy=False)
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

    def _mini_batches(self, k: int) -> list[list[int]]:
        """Row indices of each mini-batch of one epoch: all rows in order for one mini-batch, else a
        seeded shuffle split into `mini_batches` near-equal parts (empty parts dropped)."""
        n = self.optim_cfg.mini_batches
        if n == 1:
            return [list(range(k))]
        order = torch.randperm(k, generator=self.shuffle).tolist()
        return [part for part in (order[i::n] for i in range(n)) if part]

    def update(self, batch: Batch) -> UpdateMetrics:
        """One batch of rollouts → optimizer steps (see the module docstring for the order)."""
        t0 = time.perf_counter()
        cfg = self.algo
        ocfg = self.optim_cfg
        batch = Batch(**{k: v.to(self.device) for k, v in batch.__dict__.items()})
        self._dummy = batch.select([0])  # what an empty micro-batch slot forwards
        mask_all = batch.loss_mask.bool()

        # 1. rewards → advantages (over whole groups, before any filtering)
        rewards = batch.rewards
        shaped = rewards
        if cfg.overlong.enabled:
            shaped = rewards + algo.overlong_penalty(batch.loss_mask.sum(1), cfg.overlong.max_len,
                                                     cfg.overlong.buffer_len, cfg.overlong.factor)
        adv = algo.group_advantages(shaped, batch.group, cfg.estimator)  # (B,)
        keep = algo.dapo_keep_mask(rewards, batch.group) if cfg.dapo_filter else torch.ones_like(mask_all[:, 0])
        keep_rows = keep.nonzero().squeeze(1).tolist()
        kept = batch.select(keep_rows)  # (K, T)
        adv_k = adv[keep_rows] if keep_rows else adv[:0]
        mask = kept.loss_mask[:, 1:].bool()  # (K, T − 1): about token t + 1
        span = kept.span[:, 1:]
        turn = kept.turn_index[:, 1:]
        n_tokens = int(mask.sum())
        base = dict(episodes=batch.size, episodes_kept=len(keep_rows), tokens=n_tokens,
                    reward_mean=float(rewards.mean()), reward_shaped_mean=float(shaped.mean()),
                    advantage_mean=float(adv_k.mean()) if keep_rows else _NAN,
                    advantage_abs_mean=float(adv_k.abs().mean()) if keep_rows else _NAN,
                    lr=float(self.optimizer.param_groups[0]["lr"]))
        if self._sum_over_ranks(float(n_tokens)) == 0:
            return self._skipped(base, t0)
        micro_all = pack_micro_batches(kept.lengths, ocfg.micro_batch_tokens) if keep_rows else []
        single_step = ocfg.ppo_epochs == 1 and ocfg.mini_batches == 1
        old_logp = kept.old_logp[:, 1:]  # (K, T − 1)

        # 2. pre-update policy pass: entropies for AEM (α is normalised over whole groups, so every
        # entropy is needed before the first loss) and/or the learner's own old log-probs. With one
        # micro-batch and one optimizer step the loss pass of step 4 has the same numbers: no sweep.
        # Each rank holds whole groups, so that holds per rank; the ranks agree on it (a ZeRO-3 forward
        # is a collective, so all take the pre-pass or none does).
        token_adv: Tensor = adv_k  # (K,) broadcast over tokens, or (K, T − 1) with AEM
        mismatch = None  # engine vs learner, when the learner recomputes the old log-probs
        is_weights = None  # (K, T − 1) rollout_is weights
        alpha = torch.ones(1, device=self.device)
        aem_in_loss_pass = (cfg.aem.enabled and single_step and not cfg.recompute_old_logp
                            and self._max_over_ranks(len(micro_all)) == 1)
        if (cfg.aem.enabled and not aem_in_loss_pass) or cfg.recompute_old_logp:
            self.policy.eval()
            pre = self._no_grad_pass(self.policy, kept, micro_all, compute_entropy=cfg.aem.enabled)
            if cfg.aem.enabled:
                token_adv, alpha = algo.aem_advantages(adv_k, kept.group, pre.entropy, turn, mask, cfg.aem.lam)
            if cfg.recompute_old_logp:
                engine_logp = old_logp
                old_logp = torch.where(mask, pre.logp, 0.0)
                # how far the engine's sampling distribution is from the learner's, and (rollout_is) its correction
                isc = cfg.rollout_is
                isw = algo.importance_weights(old_logp, engine_logp, mask, level=isc.level,
                                              mode="truncate" if isc.mode == "off" else isc.mode, cap=isc.cap,
                                              lower=isc.lower or None)
                mismatch = algo.is_metrics(isw, old_logp, engine_logp, mask, level=isc.level)
                if isc.mode != "off":
                    is_weights = isw.weights

        # 3. reference pass: energy for ActFocus, log-probs for the KL
        ref = None
        weights = None
        if self.reference is not None:
            ref = self._no_grad_pass(self.reference, kept, micro_all, compute_entropy=False)
        if cfg.actfocus.enabled:
            assert ref is not None
            weights = self._actfocus_weights(ref.energy, span, mask)
        actfocus_w = weights
        if is_weights is not None:  # both are per-token factors of the policy-gradient term
            weights = is_weights if weights is None else weights * is_weights

        # 4. epochs × mini-batches optimizer steps; within one, per micro-batch losses are scaled so
        # that their sum (and the average over ranks) is the mini-batch's aggregate loss
        agg = cfg.loss_agg
        horizon = self._max_over_ranks(mask.shape[1])
        self.policy.train()
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        tok_metrics = {"clipfrac_low": 0.0, "clipfrac_high": 0.0, "clipfrac_dual": 0.0, "approx_kl": 0.0}
        steps = 0
        n_micro = 0
        for _epoch in range(ocfg.ppo_epochs):
            for mini in self._mini_batches(len(keep_rows)):
                mini_mask = mask[mini] if mini else mask[:0]
                mini_tok = self._sum_over_ranks(float(mini_mask.sum()))
                mini_seqs = self._sum_over_ranks(float((mini_mask.sum(1) > 0).sum()))
                if mini_tok == 0:
                    continue
                sub = [[mini[i] for i in part] for part in pack_micro_batches(kept.lengths[mini],
                                                                           ocfg.micro_batch_tokens)]
                slots = self._padded(sub)
                self._begin_accumulation(len(slots))
                for rows in slots:
                    n_micro += 1
                    if rows is None:  # an empty slot: a zero loss keeps collectives in step
                        s = self._stats(self.policy, self._dummy, compute_entropy=False)
                        self._backward(s.logp.sum() * 0.0)
                        continue
                    mb = kept.select(rows)
                    idx = torch.as_tensor(rows, device=self.device)
                    s = self._stats(self.policy, mb)
                    w = s.logp.shape[1]
                    if aem_in_loss_pass:  # the one micro-batch holds every row (in packing order)
                        ent = torch.zeros(mask.shape, device=self.device)
                        ent[idx, :w] = s.entropy.detach().float()
                        token_adv, alpha = algo.aem_advantages(adv_k, kept.group, ent, turn, mask, cfg.aem.lam)
                    mb_mask = mb.loss_mask[:, 1:].bool()
                    mb_tok = int(mb_mask.sum())
                    if mb_tok == 0:
                        self._backward(s.logp.sum() * 0.0)
                        continue
                    mb_adv = token_adv[idx] if token_adv.ndim == 1 else token_adv[idx, :w]
                    mb_w = weights[idx, :w] if weights is not None else None
                    # the world size undoes the ranks' gradient averaging
                    if agg == "token-mean":
                        scale, mb_agg = mb_tok / mini_tok, agg
                    else:
                        scale, mb_agg = int((mb_mask.sum(1) > 0).sum()) / mini_seqs, agg
                        if agg == "seq-mean-token-sum-norm":  # the constant horizon is the batch's T
                            scale, mb_agg = scale / horizon, "seq-mean-token-sum"
                    scale *= self.world_size
                    pg, m = algo.policy_loss(s.logp, old_logp[idx, :w], mb_adv, mb_mask, weights=mb_w,
                                             clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                             dual_clip=cfg.dual_clip, agg=mb_agg)
                    loss = pg * scale
                    frac = mb_tok / mini_tok * self.world_size
                    if cfg.kl.coef > 0:
                        assert ref is not None
                        kl_tok = algo.kl_penalty(s.logp, ref.logp[idx, :w], cfg.kl.kind)
                        kl = algo.aggregate_loss(kl_tok, mb_mask, "token-mean") * frac
                        loss = loss + cfg.kl.coef * kl
                        sums["kl"] += float(kl.detach())
                    self._backward(loss)
                    sums["loss"] += float(loss.detach())
                    sums["pg"] += float(pg.detach()) * scale
                    sums["entropy"] += float(torch.where(mb_mask, s.entropy, 0).sum())
                    for k in tok_metrics:
                        tok_metrics[k] += float(m[k]) * frac
                sums["grad_norm"] += self._optimizer_step()
                steps += 1
                self.step += 1
        if steps == 0:
            return self._skipped(base, t0)
        # per optimizer step averages (a rank's share of each mini-batch: the sum over ranks is the mean)
        ws = self.world_size
        loss_m, pg_m, kl_m = sums["loss"] / steps / ws, sums["pg"] / steps / ws, sums["kl"] / steps / ws
        tok_metrics = {k: v / steps / ws for k, v in tok_metrics.items()}
        passes = ocfg.ppo_epochs

        # 5. metrics (this rank's kept episodes)
        action = mask & (span == algo.SPAN_ACTION)
        reasoning = mask & (span == algo.SPAN_REASONING)
        corr: dict[str, Any] = {}
        if ref is not None:
            energies, variances = group_energy_reward_stats(ref.energy, action, kept.rewards, kept.group)
            pearson, spearman = energy_reward_correlation(energies, variances)
            corr = dict(energy_reward_corr_pearson=pearson, energy_reward_corr_spearman=spearman,
                        energy_reward_corr_groups=sum(math.isfinite(e) for e in energies))
        if actfocus_w is not None:
            w_tok = actfocus_w[action | reasoning]
            if w_tok.numel():
                corr.update(actfocus_weight_min=float(w_tok.min()), actfocus_weight_max=float(w_tok.max()))
        if mismatch is not None:
            corr.update(is_ratio_mean=mismatch.ratio_mean, is_ratio_max=mismatch.ratio_max,
                        is_capped_fraction=mismatch.capped_fraction, mismatch_kl_k1=mismatch.mismatch_k1,
                        mismatch_kl_k3=mismatch.mismatch_k3)
        dt = time.perf_counter() - t0
        return UpdateMetrics(
            step=self.step, skipped=False, micro_batches=n_micro, optimizer_steps=steps, **base,
            loss=loss_m, pg_loss=pg_m, kl=kl_m if cfg.kl.coef > 0 else _NAN,
            grad_norm=sums["grad_norm"] / steps, entropy=sums["entropy"] / max(1, n_tokens * passes),
            **tok_metrics,
            aem_alpha_mean=float(alpha.mean()), aem_alpha_min=float(alpha.min()),
            aem_alpha_max=float(alpha.max()),
            actfocus_weight_action=_mean(actfocus_w, action) if actfocus_w is not None else 1.0,
            actfocus_weight_reasoning=_mean(actfocus_w, reasoning) if actfocus_w is not None else 1.0,
            action_token_share=float(action.sum()) / n_tokens if n_tokens else _NAN,
            energy_action=_mean(ref.energy, action) if ref is not None else _NAN,
            energy_reasoning=_mean(ref.energy, reasoning) if ref is not None else _NAN,
            update_s=dt, tokens_per_s=float(kept.lengths.sum()) * passes / dt, **corr,
        )

    def _skipped(self, base: dict[str, Any], t0: float) -> UpdateMetrics:
        dt = time.perf_counter() - t0
        return UpdateMetrics(
            step=self.step, skipped=True, micro_batches=0, optimizer_steps=0, **base, loss=0.0, pg_loss=0.0, kl=_NAN,
            clipfrac_low=0.0, clipfrac_high=0.0, clipfrac_dual=0.0, approx_kl=0.0, grad_norm=0.0,
            entropy=_NAN, aem_alpha_mean=1.0, aem_alpha_min=1.0, aem_alpha_max=1.0,
            actfocus_weight_action=1.0, actfocus_weight_reasoning=1.0, action_token_share=_NAN,
            energy_action=_NAN, energy_reasoning=_NAN, update_s=dt, tokens_per_s=0.0)

    # ---- weights, checkpoints, export ----------------------------------------------------------

    def policy_state_dict(self) -> dict[str, Tensor]:
        """The policy's weights, for the rollout engine's `update_weights` (detached, on CPU)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: policy, optimizer, LR schedule, step, RNG states."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                               "shuffle": self.shuffle.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "step": self.step, "rng": rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
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

    def save_checkpoint(self, run_dir: str | os.PathLike[str], step: int, extra: dict[str, Any] | None = None, *,
                        keep_last: int = 0) -> Path:
        """Write checkpoint `step` of `run_dir` atomically: this learner's state plus `extra` (the loop's
        own state, e.g. its RNGs and step). A distributed learner writes one shard per rank (call it on
        every rank). Keeps the newest `keep_last` checkpoints when > 0; returns the directory."""
        from swerl.learner.checkpoint import save_checkpoint

        return save_checkpoint(run_dir, step, {"learner": self.state_dict(), **(extra or {})}, keep_last=keep_last)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore from a checkpoint directory written by `save_checkpoint`; returns its `extra`."""
        from swerl.learner.checkpoint import load_checkpoint

        state = load_checkpoint(path)
        self.load_state_dict(state.pop("learner"))
        return state

    def export_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
        """Write the policy in HF format (save_pretrained, + the tokenizer when given), atomically."""
        from swerl.learner.checkpoint import atomic_dir

        with atomic_dir(directory) as tmp:
            self.policy.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        return Path(directory)
