"""A scripted expert that knows the goal: search the instruction, page through the results to the
goal's product, open it, pick the goal's options, buy. Used by tests and as a reference policy (it
scores 1.0 on every goal of a generated catalog whose product the search finds within 5 pages)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swerl.envs.webshop.data import Goal
from swerl.structs import GameObs

if TYPE_CHECKING:
    from swerl.envs.webshop.game import WebShopGame

MAX_RESULT_PAGES = 5


def goal_query(goal: Goal) -> str:
    """The instruction without its price clause: what a shopper would type."""
    return goal.instruction_text.split(", and price lower than")[0]


class WebShopExpert:
    """One episode's expert. `act` takes the last observation and returns the next action."""

    def __init__(self, goal: Goal) -> None:
        self.goal = goal
        self.queries = [goal_query(goal), " ".join([*goal.attributes, goal.query])]
        self.searches = 0
        self.pages_seen = 0
        self.chosen: set[str] = set()

    def act(self, obs: GameObs) -> str:
        if obs.done:
            raise RuntimeError("the episode is over")
        can = set(obs.admissible)
        if "search[<your query>]" in can:
            q = self.queries[min(self.searches, len(self.queries) - 1)]
            self.searches += 1
            self.pages_seen = 1
            return f"search[{q}]"
        if "click[buy now]" in can:
            for _, value in self.goal.goal_options:
                if value not in self.chosen and f"click[{value}]" in can:
                    self.chosen.add(value)
                    return f"click[{value}]"
            return "click[buy now]"
        target = f"click[{self.goal.asin.lower()}]"
        if target in can:
            self.chosen.clear()
            return target
        if "click[next >]" in can and self.pages_seen < MAX_RESULT_PAGES:
            self.pages_seen += 1
            return "click[next >]"
        return "click[back to search]"


def expert_actions(game: WebShopGame, goal_id: str, max_steps: int = 30) -> list[str]:
    """The expert's actions for `goal_id`, found by playing it on an in-process game (the game is
    deterministic, so the same actions replay the same episode anywhere, e.g. in a sandbox or
    through a scripted engine)."""
    obs = game.reset(goal_id)
    expert = WebShopExpert(game.catalog.goal(goal_id))
    actions: list[str] = []
    while not obs.done:
        if len(actions) >= max_steps:
            raise RuntimeError(f"the expert did not finish goal {goal_id} within {max_steps} steps")
        actions.append(expert.act(obs))
        obs = game.step(actions[-1])
    return actions
