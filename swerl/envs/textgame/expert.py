"""Scripted play of text games: `ExpertEngine`, an engine that plays each game's expert plan (for
evaluating the harness, demos and tests), and `scripted_turn`, a model turn that plays one action.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swerl.structs import Generation


def scripted_turn(action: str, thought: str = "", tag: str = "action") -> str:
    """A model turn that plays `action` (what scripted policies, demos and tests emit), written the way
    Qwen's template renders a turn in history, so the token-exact trajectory shows no drift. `tag`: the
    action tag the game's format takes (`answer` for the puzzle games)."""
    head = f"<think>\n{thought.strip()}\n</think>\n\n" if thought.strip() else ""
    return f"{head}<{tag}>{action}</{tag}>"


class ExpertPlans(dict[str, list[str]]):
    """Expert plans keyed as `ExpertEngine` wants them, with the action tag their games take (an
    `ExpertEngine` given these plays them in that tag unless told another)."""

    def __init__(self, plans: dict[str, list[str]] | None = None, *, tag: str = "action") -> None:
        super().__init__(plans or {})
        self.tag = tag


class ExpertEngine:
    """A scripted policy for text games, not a model: plays each game's expert plan. It finds the game
    from the prompt (every plan is keyed by a text that occurs only in its game's opening messages,
    e.g. the game's first observation) and the step from the number of model turns so far, so one
    engine serves many concurrent episodes, as a model does. Answers end with the end-of-turn token;
    logprobs are 0. `tag`: the action tag of its turns (default: the plans' own, see `ExpertPlans`,
    else `action`)."""

    def __init__(self, tokenizer: Any, plans: dict[str, Sequence[str]], *,
                 turn_marker: str = "<|im_start|>assistant", tag: str | None = None) -> None:
        if not plans:
            raise ValueError("ExpertEngine needs at least one plan")
        self.tag = tag or getattr(plans, "tag", "action")
        self.tokenizer = tokenizer
        self.plans = {key: list(plan) for key, plan in plans.items()}
        self.turn_marker = turn_marker
        self.end_id = tokenizer.eos_token_id

    async def generate(self, prompt_ids: list[int], params: Any) -> Generation:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        keys = [key for key in self.plans if key in text]
        if len(keys) != 1:
            raise RuntimeError(f"ExpertEngine: the prompt matches {len(keys)} of its {len(self.plans)} "
                               "plans; each plan's key must occur in exactly one game's prompt")
        turn = text.count(self.turn_marker) - 1  # the generation prompt opens the current turn
        if turn < 0:
            raise RuntimeError(f"ExpertEngine: no {self.turn_marker!r} in the prompt; pass the template's "
                               "marker")
        plan = self.plans[keys[0]]
        action = plan[turn] if turn < len(plan) else "look"
        ids = [*self.tokenizer(scripted_turn(action, tag=self.tag), add_special_tokens=False)["input_ids"],
               self.end_id]
        ids = ids[:params.max_new_tokens]
        finish = "stop" if ids[-1] == self.end_id else "length"
        return Generation(token_ids=tuple(ids), logprobs=(0.0,) * len(ids), finish_reason=finish)

    async def close(self) -> None:
        return None
