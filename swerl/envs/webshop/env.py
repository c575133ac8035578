"""The WebShop agent environment: `TextGameEnv` with WebShop's prompt wording and its purchase score
as the reward.

    game = make_game("webshop", catalog_dir="tasks/webshop", show_instruction=False)
    env = WebShopEnv(game, "test-0003")
    traj = await run_episode(env, engine, tokenizer, limits=env.config.episode_limits())

Reward of an episode: `score_scale` x the purchase score (0..1, WebShop's reward) when the agent buys,
plus `config.win_reward` when the score is 1.0, minus `config.invalid_penalty` per action that was
not available. An episode that never buys scores 0 (truncated at `config.max_steps`, verl-agent's 15).

Imported on its own (`swerl.envs.webshop.env`), not by the package: the game itself must import
inside the text-game image, where the agent modules are not installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from swerl.envs.textgame.env import TextGameConfig, TextGameEnv, TextGamePrompt
from swerl.envs.textgame.tasks import GameOptions
from swerl.envs.webshop.expert import expert_actions
from swerl.envs.webshop.game import WebShopGame
from swerl.structs import EnvStart, ParsedTurn, StepResult

WEBSHOP_PROMPT = TextGamePrompt(
    system=("You are a shopping agent in the WebShop online store. A shopper tells you what to buy; you find "
            "it by searching, opening products, choosing the right options and buying. Each turn, think step "
            "by step inside <think> </think> about the page and the request, then write exactly one of the "
            "admissible actions inside <action> </action>: search[your keywords] where the page has a search "
            "bar, or click[element] for a button, a product id or an option value shown on the page."),
    first=("Shopping request: {task}\n\nCurrent page (step {step} of at most {max_steps}):\n{observation}\n\n"
           "Admissible actions:\n{actions}\n\nWhen you search, replace <your query> with your own keywords. "
           "Think inside <think> </think>, then give one action inside <action> </action>."),
    step=("{history}Page after your action (step {step} of at most {max_steps}):\n{observation}\n\n"
          "Admissible actions:\n{actions}"),
    invalid=("{history}\"{action}\" is not available on this page, so nothing changed (penalty {penalty}). "
             "Step {step} of at most {max_steps}. The page is still:\n{observation}\n\nAdmissible actions:\n"
             "{actions}"),
    history_line="[{step}] {action} -> {observation}",
)

WEBSHOP_CONFIG = TextGameConfig(win_reward=0.0, invalid_penalty=0.1, max_steps=15)
"""verl-agent's WebShop budget (15 steps); the reward comes from the score (see WebShopEnv.score_scale)."""

GAME_KWARGS: dict[str, Any] = {"catalog_dir": "tasks/webshop", "show_instruction": False}
"""How the agent environment constructs the game: the prompt states the request once, so the pages
leave out WebShop's repeated "Instruction:" header."""


@dataclass
class WebShopEnv(TextGameEnv):
    """`TextGameEnv` for WebShop (see the module docstring). `score` is the purchase score of the
    episode (0 until it buys)."""

    prompt: TextGamePrompt = WEBSHOP_PROMPT
    config: TextGameConfig = field(default_factory=lambda: WEBSHOP_CONFIG)
    score_scale: float = 10.0
    """Reward per unit of purchase score (a perfect purchase pays score_scale)."""
    score: float = 0.0

    def __post_init__(self) -> None:
        if self.score_scale < 0:
            raise ValueError(f"WebShopEnv.score_scale must be >= 0, got {self.score_scale}")

    def reset(self) -> EnvStart:
        self.score = 0.0
        return super().reset()

    def step(self, turn: ParsedTurn) -> StepResult:
        result = super().step(turn)
        if result.terminated and self.last is not None and self.last.done:
            self.score = self.last.reward
            self.total_reward += self.score_scale * self.score
            result = replace(result, reward=self.total_reward)
        return result


# ---- evaluation (`swerl eval --game webshop`): the options the generic text-game evaluation needs ----

HELDOUT_SPLIT = "test"


def _kwargs(catalog_dir: str | None) -> dict[str, Any]:
    return {**GAME_KWARGS, **({"catalog_dir": catalog_dir} if catalog_dir else {})}


def list_games(catalog_dir: str | None = None, split: str = HELDOUT_SPLIT) -> list[str]:
    """Goal ids of one split of the catalog (default: the shipped one), in order."""
    return WebShopGame(**_kwargs(catalog_dir)).catalog.goal_ids(split)


def eval_options(catalog_dir: str | None = None, *, score_scale: float = 10.0) -> GameOptions:
    """How to play WebShop (training and `swerl.eval.episodes`): how to build the game and its env
    (`WebShopEnv`: the episode reward is `score_scale` x the purchase score), the prompt, the
    default rewards and budget (`WEBSHOP_CONFIG`) and the grouping of the report (the goal product's
    category)."""
    catalog = WebShopGame(**_kwargs(catalog_dir)).catalog

    def make_env(game: Any, goal_id: str, prompt: TextGamePrompt, config: TextGameConfig) -> WebShopEnv:
        return WebShopEnv(game, goal_id, prompt=prompt, config=config, score_scale=score_scale)

    return GameOptions(game_kwargs=_kwargs(catalog_dir), prompt=WEBSHOP_PROMPT, config=WEBSHOP_CONFIG,
                       make_env=make_env, group_of=lambda gid: catalog.goal(gid).category)


def expert_plans(goal_ids: list[str], catalog_dir: str | None = None) -> dict[str, list[str]]:
    """The expert's actions for each goal, keyed by the goal's instruction (for
    `swerl.envs.textgame.expert.ExpertEngine`, which finds the plan whose key is in the prompt)."""
    game = WebShopGame(**_kwargs(catalog_dir))
    plans: dict[str, list[str]] = {}
    for gid in goal_ids:
        key = game.catalog.goal(gid).instruction_text
        if key in plans:
            raise ValueError(f"two goals share the instruction {key!r}: the expert cannot tell them apart")
        plans[key] = expert_actions(game, gid)
    return plans
