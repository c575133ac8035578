"""`HFEngine`: in-process generation with a transformers causal LM, batched across episodes. The CPU
default, and the reference the server engines are checked against.

Batching: every `generate()` call puts its request on a queue and awaits a future. One worker task
takes the queue's head, waits a short window (`batch_window_s`) so that episodes which finished
their tool calls at about the same time land in the same batch, and decodes up to `max_batch`
requests together: prompts left-padded, one prefill, then one decode step per token for the whole
batch. Each row stops on its own stop tokens / max_new_tokens; finished rows are dropped from the
batch and its KV cache (`batch_select_indices`) so they cost nothing afterwards. Requests that
arrive while a batch runs form the next batch.

This "gathered static batch" is simpler than continuous batching (rows joining mid-flight would need
a ragged KV cache) and exact: every row sees exactly its own prompt, so logprobs agree with a
teacher-forced forward pass. On CPU the step cost grows slowly with the batch size, so gathering is
where the throughput comes from; a running batch delays newcomers by at most one batch's decode.

The decode loop is hand-written instead of `model.generate`: requests in one batch have their own
temperature, top-p, stop tokens and token budget, and the logprob of each sampled token is needed
(see `swerl.rollout.engine` for the convention).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from swerl.rollout.engine import EngineError, WeightSource, check_n
from swerl.structs import Generation, SamplingParams


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    out_ids: list[int] = field(default_factory=list)
    out_lp: list[float] = field(default_factory=list)


class HFEngine:
    """A transformers causal LM behind the `RolloutEngine` protocol."""

    def __init__(self, model: str | os.PathLike[str] | Any, *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, max_batch: int = 32, batch_window_s: float = 0.005,
                 seed: int | None = None, pad_token_id: int | None = None) -> None:
        """`model`: an HF checkpoint directory (or hub id) or an already loaded `PreTrainedModel`.
        `seed`: makes sampling reproducible for a given sequence of batches."""
        if max_batch < 1:
            raise ValueError(f"HFEngine.max_batch must be >= 1, got {max_batch}")
        if batch_window_s < 0:
            raise ValueError(f"HFEngine.batch_window_s must be >= 0, got {batch_window_s}")
        if isinstance(model, (str, os.PathLike)):
            model = self._load(model, dtype, device)
        self.model = model.eval()
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        cfg = model.config
        pad = pad_token_id if pad_token_id is not None else cfg.pad_token_id
        # any valid id works as padding: padded positions are masked out of attention
        self.pad_token_id = int(pad if pad is not None else 0)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed if seed is not None else torch.seed())
        self.weight_version = 0
        self.batches = 0  # batches decoded so far (tests and benchmarks read it)
        self.batch_sizes: list[int] = []
        self.busy_s = 0.0  # seconds spent decoding (1 - busy_s / wall = time the engine sat idle)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._busy: asyncio.Lock | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    @staticmethod
    def _load(path: str | os.PathLike[str], dtype: torch.dtype, device: str) -> Any:
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM.from_pretrained(os.fspath(path), dtype=dtype).to(device)
        except OSError as e:
            raise EngineError(f"HFEngine could not load a model from {os.fspath(path)!r}: {e}") from e

    # ---- the asyncio side ----------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        """Start the batching worker in the running loop. asyncio primitives belong to one loop, and
        callers (tests, scripts) may use the engine from several `asyncio.run`s in turn."""
        if self._closed:
            raise EngineError("HFEngine is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = []
            self._wake = asyncio.Event()
            self._busy = asyncio.Lock()
            self._worker = loop.create_task(self._work(), name="HFEngine-batcher")

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return (await self._submit([list(prompt_ids)], params))[0]

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams,
                         n: int) -> tuple[Generation, ...]:
        check_n(n)
        return tuple(await self._submit([list(prompt_ids)] * n, params))

    async def _submit(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        for p in prompts:
            if not p:
                raise ValueError("HFEngine.generate needs a non-empty prompt")
        self._ensure_worker()
        assert self._loop is not None and self._wake is not None
        reqs = [_Request(p, params, self._loop.create_future()) for p in prompts]
        self._queue.extend(reqs)
        self._wake.set()
        return list(await asyncio.gather(*(r.future for r in reqs)))

    async def _work(self) -> None:
        assert self._wake is not None and self._busy is not None
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if self.batch_window_s and len(self._queue) < self.max_batch:
                await asyncio.sleep(self.batch_window_s)
            batch = [r for r in self._queue[:self.max_batch] if not r.future.cancelled()]
            del self._queue[:self.max_batch]
            if not batch:
                continue
            async with self._busy:  # weight updates wait for the running batch, and vice versa
                t0 = time.monotonic()
                try:
                    await asyncio.to_thread(self._decode, batch)
                except Exception as e:  # the batch's callers get the failure; the worker lives on
                    err = EngineError(f"HFEngine batch of {len(batch)} failed: {type(e).__name__}: {e}")
                    err.__cause__ = e
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(err)
                    continue
                finally:
                    self.busy_s += time.monotonic() - t0
            self.batches += 1
            self.batch_sizes.append(len(batch))
            for r in batch:
                if not r.future.done():
                    finish = "stop" if r.out_ids and r.out_ids[-1] in self._stops(r) else "length"
                    r.future.set_result(Generation(token_ids=tuple(r.out_ids), logprobs=tuple(r.out_lp),
                                                   finish_reason=finish))

    @staticmethod
    def _stops(r: _Request) -> set[int]:
        return set(r.params.stop_token_ids)

    # ---- the torch side (runs in a worker thread) ----------------------------------------------

    @torch.inference_mode()
    def _decode(self, batch: list[_Request]) -> None:
        dev = self.device
        n = len(batch)
        width = max(len(r.prompt) for r in batch)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        # positions count real tokens only, so a left-padded row sees the positions it would alone
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        # logits_to_keep=1: the full [batch, prompt, 151936] logits of a long prompt would be GBs
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         logits_to_keep=1)
        cache = out.cache
        logits = out.logits[:, -1, :].float()
        last_pos = pos[:, -1]

        temps = torch.tensor([r.params.temperature for r in batch], dtype=torch.float32, device=dev)
        top_ps = torch.tensor([r.params.top_p for r in batch], dtype=torch.float32, device=dev)
        stops = [self._stops(r) for r in batch]
        rows = list(range(n))  # batch row -> request index
        while True:
            tok, lp = self._sample(logits, temps, top_ps)
            keep = []
            for j, (t, logp) in enumerate(zip(tok.tolist(), lp.tolist(), strict=True)):
                r = batch[rows[j]]
                r.out_ids.append(t)
                r.out_lp.append(logp)
                if t not in stops[rows[j]] and len(r.out_ids) < r.params.max_new_tokens:
                    keep.append(j)
            if not keep:
                return
            if len(keep) < len(rows):  # drop finished rows from every per-row tensor and the cache
                k = torch.tensor(keep, device=dev)
                cache.batch_select_indices(k)
                rows = [rows[j] for j in keep]
                tok, mask, last_pos, temps, top_ps = tok[k], mask[k], last_pos[k], temps[k], top_ps[k]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=dev)], dim=1)
            last_pos = last_pos + 1
            out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                             cache=cache, use_cache=True)
            cache = out.cache
            logits = out.logits[:, -1, :].float()

    def _sample(self, logits: torch.Tensor, temps: torch.Tensor,
                top_ps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row and its logprob under log_softmax(logits / T) (T = 0: greedy, unscaled)."""
        greedy = temps == 0
        scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
        logp = torch.log_softmax(scaled, dim=-1)
        probs = logp.exp()
        if bool((top_ps < 1).any()):
            sp, si = probs.sort(dim=-1, descending=True)
            # drop a token once the mass before it already reaches top_p (the first is always kept)
            drop = (sp.cumsum(-1) - sp) >= top_ps[:, None]
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, si, sp)
        # inverse-CDF sampling: over a 152k vocabulary it is ~20x faster than torch.multinomial on CPU
        cdf = probs.cumsum(-1)
        u = torch.rand(probs.shape[0], 1, generator=self.generator, device=probs.device) * cdf[:, -1:]
        # right=True picks the first index whose cdf exceeds u, which never has zero probability
        sampled = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
        tok = torch.where(greedy, logits.argmax(-1), sampled)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    # ---- weights and lifetime ------------------------------------------------------------------

    async def update_weights(self, weights: WeightSource) -> None:
        """Load a state dict, or an HF checkpoint directory (same architecture), into the model in
        place; waits for the running batch to finish first."""
        self._ensure_worker()
        assert self._busy is not None
        async with self._busy:
            await asyncio.to_thread(self._load_weights, weights)
        self.weight_version += 1

    async def update_weights_from_buckets(self, buckets: Iterable[Any]) -> None:
        """Copy weights into the model bucket by bucket (`rollout.weight_sync: memory`; each bucket has
        `names` and `tensors`, e.g. `swerl.learner.weights.WeightBucket`): at most one bucket beyond the
        model is held. Waits for the running batch; the buckets are read on this thread (under ZeRO-3
        they are gathers every rank takes part in, in order). Every parameter and persistent buffer
        must arrive (a tied weight once, under either name), else EngineError — with the model
        partly updated, as a server's would be."""
        self._ensure_worker()
        assert self._busy is not None
        async with self._busy:
            own = dict(self.model.named_parameters(remove_duplicate=False))
            own.update((n, b) for n, b in self.model.named_buffers(remove_duplicate=False)
                       if n in self.model.state_dict())
            done: set[int] = set()
            with torch.no_grad():
                for bucket in buckets:
                    for name, t in zip(bucket.names, bucket.tensors, strict=True):
                        target = own.get(name)
                        if target is None:
                            raise EngineError("HFEngine.update_weights_from_buckets: the model has no "
                                              f"weight {name!r}")
                        if tuple(t.shape) != tuple(target.shape):
                            raise EngineError(f"HFEngine.update_weights_from_buckets: {name} has shape "
                                              f"{tuple(t.shape)}, the model's is {tuple(target.shape)}")
                        target.copy_(t)
                        done.add(id(target))
            missing = sorted(n for n, t in own.items() if id(t) not in done)
            if missing:
                raise EngineError(f"HFEngine.update_weights_from_buckets: no new value for {len(missing)} "
                                  f"weight(s), e.g. {missing[:3]}")
        self.weight_version += 1

    def _load_weights(self, weights: WeightSource) -> None:
        if isinstance(weights, Mapping):
            state = dict(weights)
        else:
            path = Path(os.fspath(weights))
            if not path.is_dir():
                raise EngineError(f"HFEngine.update_weights: {path} is not a checkpoint directory")
            state = self._load(path, self.dtype, "cpu").state_dict()
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise EngineError(f"HFEngine.update_weights: the new weights do not match the model "
                              f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
        for name, t in state.items():
            if tuple(t.shape) != tuple(own[name].shape):
                raise EngineError(f"HFEngine.update_weights: {name} has shape {tuple(t.shape)}, "
                                  f"the model's is {tuple(own[name].shape)}")
        with torch.no_grad():
            self.model.load_state_dict(state, strict=True)

    async def close(self) -> None:
        self._closed = True
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            if self._loop is asyncio.get_running_loop():
                await asyncio.gather(self._worker, return_exceptions=True)
        for r in self._queue:
            if not r.future.done():
                r.future.set_exception(EngineError("HFEngine was closed"))
        self._queue = []
