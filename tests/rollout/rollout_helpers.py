"""Reference computations shared by tests/test_rollout_*.py: independent teacher-forced and greedy
passes of a model (no engine involved).

Tolerances against them. An engine's log-probs come from other fp32 kernels (left-padded batches,
KV cache, vLLM's own CPU kernels) than this one unpadded pass, so they differ in summation order, which
is vendor-dependent. Worst-case bounds are useless here (a (V − 1)·2⁻²⁴ bound for the V = 151k-term
softmax sum is 1e-2), so use the probabilistic one (Higham & Mary 2019): a sum of n fp32 terms is off
by ≤ λ·√n·2⁻²⁴ of Σ|terms| except with probability ≤ 2·exp(−λ²/2). With λ = 7 (odds 5e-11), the
log-sum-exp over V (≤ 151k/8 terms per AVX2 lane, √n ≈ 140) is off by ≤ 6e-5 and the H = 128-term
logits by ≤ 7·√128·2⁻²⁴·Σ|h·w| ≈ 2e-5 (Σ|h·w| < 2.5 for the tiny model), moving log p by twice that:
≲ 1e-4 on each side, so abs = 2e-4 (3e-4 over the longer multi-turn contexts of the runner test)
bounds the difference of two such fp32 passes (measured ≤ 1e-6, one ulp of log p ≈ −11). vLLM's
tests allow 1e-3 for its different kernels (not run here).
Greedy comparisons need no tolerance: along these references the top-2 logit gap is ≥ 1.2e-2,
10⁴ times the logits' fp32 error, so no vendor's kernels can flip an argmax."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import torch

from swerl.rollout.http import request

ROOT = Path(__file__).resolve().parents[2]


def teacher_forced_logprobs(model, prompt: list[int], continuation: list[int],
                            temperature: float = 1.0) -> list[float]:
    """log p(continuation[i] | prompt + continuation[:i]) from one unpadded forward pass, under
    log_softmax(logits / T)."""
    ids = torch.tensor([prompt + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    scaled = logits / (temperature if temperature > 0 else 1.0)
    lp = torch.log_softmax(scaled[len(prompt) - 1:-1], dim=-1)
    return lp.gather(-1, torch.tensor(continuation)[:, None]).squeeze(-1).tolist()


def greedy_reference(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy continuation by full re-computation each step (no cache, no padding)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def trajectory_logprobs(model, token_ids: list[int], loss_mask: list[int]) -> list[float]:
    """Teacher-forced logprob of every loss-masked token of a whole trajectory (one pass)."""
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(lp[i - 1, token_ids[i]]) for i in range(1, len(token_ids)) if loss_mask[i]]


def post(url: str, path: str, body=None):
    """`POST url+path` with a JSON body: (status, the decoded JSON, or the text when it is not JSON)."""
    resp = asyncio.run(request(url, "POST", path, body, timeout=60))
    try:
        return resp.status, json.loads(resp.body)
    except ValueError:
        return resp.status, resp.text
