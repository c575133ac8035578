"""Reference computations shared by tests/test_rollout_*.py: independent teacher-forced and greedy
passes of a model (no engine involved)."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def teacher_forced_logprobs(model, prompt: list[int], continuation: list[int], temperature: float = 1.0) -> list[float]:
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
