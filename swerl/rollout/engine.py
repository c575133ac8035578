"""The `RolloutEngine` protocol: what the runner and the training loop need from an inference engine.

It extends `swerl.agent.Engine` (one `generate` per model turn, which is all `run_episode` calls), so
any RolloutEngine can drive an episode. On top of it:

- `generate_n`: n samples of one prompt in one call (GRPO groups that share a prompt; servers share
  the prompt's KV cache across the n samples);
- `update_weights`: load the learner's new weights (a checkpoint directory, or in-process tensors
  where the engine can take them) before the next rollouts;
- `close`: release the model / server processes / HTTP sessions.

Log-probability convention, shared by every engine here: the log-probability of each sampled token
under the temperature-scaled distribution, `log_softmax(logits / T)`, before top-p truncation (for
T = 0, greedy decoding, the unscaled `log_softmax(logits)`). At T = 1, the RL default, this is the
policy's log-probability, which is what the learner's importance ratios compare against.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from swerl.agent.engine import Engine
from swerl.structs import Generation, SamplingParams

WeightSource = str | os.PathLike[str] | Mapping[str, Any]
"""New weights: an HF checkpoint directory (safetensors + config) or a state dict of tensors."""


class EngineError(RuntimeError):
    """The engine (or its server) failed: the episode that called it cannot go on."""


class EngineUnavailable(EngineError):
    """The server is gone (connection refused / reset after all retries); the message names the URL
    and what to do."""


class EngineTimeout(EngineError):
    """A generation took longer than the caller allowed. Deliberately not a `TimeoutError`:
    `run_episode` reads `TimeoutError` as its own wall-clock budget running out, and a stuck engine
    is a harness failure, not a truncated episode."""


@runtime_checkable
class RolloutEngine(Engine, Protocol):
    """An inference engine for rollouts. Every method is a coroutine; engines are safe to call from
    many episodes at once (that is how they batch)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Sample one continuation of `prompt_ids`: at most `params.max_new_tokens` tokens, ending at
        the first of `params.stop_token_ids` (included in the result). `finish_reason` is `stop`,
        `length` or `abort`; `logprobs[i]` is the log-probability of `token_ids[i]` (see the module
        docstring for the convention)."""
        ...

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams,
                         n: int) -> tuple[Generation, ...]:
        """`n` independent samples of the same prompt, in one call."""
        ...

    async def update_weights(self, weights: WeightSource) -> None:
        """Replace the model's weights; generations that start afterwards use the new ones, and any
        cache of the old ones (prefix / radix cache) is dropped."""
        ...

    async def close(self) -> None:
        """Release everything the engine holds (idempotent)."""
        ...


def check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"generate_n needs n >= 1, got {n}")
