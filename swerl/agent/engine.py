"""The engine protocol the episode drives, and a scripted policy for tests and demos.

The real engines (HF, SGLang, vLLM) live in `swerl.rollout` and implement `Engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from swerl.structs import Generation, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """Anything that samples one model turn from a token prompt."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Sample up to `params.max_new_tokens` tokens after `prompt_ids`; stop at any of
        `params.stop_token_ids` (the stop token is included in the result)."""
        ...


class ScriptedEngine:
    """A scripted policy, not a model: returns fixed texts in order, tokenised with the real tokenizer
    and followed by the end-of-turn token, as a real model's sample would be. For tests and demos.

    Honours `max_new_tokens` (cut → finish_reason `length`, no end-of-turn token) and
    `stop_token_ids` (cut after the first stop token found in the scripted tokens).
    """

    def __init__(self, tokenizer: Any, outputs: Sequence[str], *, logprob: float = 0.0,
                 end_token: str | None = None) -> None:
        if isinstance(outputs, str):
            raise TypeError("ScriptedEngine outputs must be a sequence of turn texts, not one string")
        self.tokenizer = tokenizer
        self.outputs = list(outputs)
        self.logprob = logprob
        end = end_token or tokenizer.eos_token
        self.end_id = tokenizer.convert_tokens_to_ids(end)
        if self.end_id is None or self.end_id == tokenizer.unk_token_id:
            raise ValueError(f"end-of-turn token {end!r} is not in the tokenizer's vocabulary")
        self.calls = 0
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self.calls >= len(self.outputs):
            raise RuntimeError(f"ScriptedEngine ran out of script: turn {self.calls + 1} requested, "
                               f"only {len(self.outputs)} scripted")
        text = self.outputs[self.calls]
        self.calls += 1
        self.prompts.append(list(prompt_ids))
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.end_id]
        finish = "stop"
        stops = set(params.stop_token_ids) | {self.end_id}
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids) - 1)
        ids = ids[:cut + 1]
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[:params.max_new_tokens], "length"
        return Generation(token_ids=tuple(ids), logprobs=tuple([self.logprob] * len(ids)),
                          finish_reason=finish)
