"""The env kinds: one `EnvKind` per kind, the only list of them. Training (`env.kind`, the `env.<kind>`
config sections), evaluation and the CLI (`swerl eval --game`) read the kinds from here.

A kind is played one of two ways:

- through the runner (`task_set`): its task set turns a task id into the `EpisodeSpec`s of a rollout
  group (an agent episode over a chat template, usually in a sandbox): swe and the text games;
- straight on the engine's token ids (`engine_game`): the toy game, with its own tiny vocabulary, no
  tokenizer, runner or sandbox.

The text games (`games`) also list their games per split and carry their expert plans and evaluation
options. Which game class serves a text-game kind inside the sandbox image is the game server's table
(`swerl.envs.textgame.protocol.GAME_KINDS`): that module runs in the image, where only the games are
installed, so it cannot import this one; a test keeps the two in step.

Adding a kind: write its config dataclass and task set (or game listing), add an `EnvKind` to `ENV_KINDS`
and a same-named section to `swerl.train_config.EnvConfig` (its field docstring is the YAML help).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from swerl.agent.env import EpisodeSpec
from swerl.envs.swe.tasks import SWETaskConfig, SWETaskSet, swe_success
from swerl.envs.textgame.tasks import GameListing, GameOptions, GameTaskConfig, GameTaskSet, game_won
from swerl.envs.toy import ToyEnvConfig, toy_step, toy_success
from swerl.structs import Trajectory


class TaskSet(Protocol):
    """The tasks of one environment kind, for the training loop."""

    ids: tuple[str, ...]
    """Task ids the loop samples from (in a fixed order)."""

    def prepare(self, task_ids: Sequence[str]) -> None:
        """Make the tasks runnable (e.g. build their images) before their episodes start."""
        ...

    def specs(self, task_id: str, group: int, n: int) -> list[EpisodeSpec]:
        """The `n` episodes of one rollout group on `task_id`."""
        ...


class TaskSetFactory(Protocol):
    """Builds a kind's task set from its config section; `max_steps`: the loop's turn budget."""

    def __call__(self, section: Any, *, max_steps: int) -> TaskSet: ...


@dataclass(frozen=True)
class EngineGame:
    """A kind played straight on the engine's token ids (see the module docstring)."""

    vocab_size: Callable[[Any], int]
    """vocab_size(section): the vocabulary of the random-init policy the game is played by."""
    rollouts: Callable[[Any, Any, random.Random, int, int, float],
                       Awaitable[tuple[list[Trajectory], list[int]]]]
    """rollouts(engine, section, rng, tasks, n, temperature): one step's episodes, `n` on each of `tasks`
    tasks drawn from `rng`: (trajectories, group index of each)."""


@dataclass(frozen=True)
class EnvKind:
    """One environment kind: its config section, where its tasks come from and what counts as success."""

    name: str
    """`env.kind`, and the name of the config section `env.<name>`."""
    config: type
    """The dataclass of the `env.<name>` section."""
    summary: str
    """One line on what it is."""
    heldout_split: str
    """The split evaluations use by default ('': the toy game evaluates every cue)."""
    success: Callable[[Trajectory], bool]
    """Whether an episode solved its task (success / resolve rate)."""
    task_set: TaskSetFactory | None = None
    """Played through the runner: builds the task set."""
    engine_game: EngineGame | None = None
    """Played on the engine's tokens."""
    games: GameListing | None = None
    """Text games: the game listing, options and expert plans (`swerl eval --game`)."""

    def __post_init__(self) -> None:
        if (self.task_set is None) == (self.engine_game is None):
            raise ValueError(f"env kind {self.name!r}: give exactly one of task_set and engine_game")


def _swe_tasks(section: Any, *, max_steps: int) -> TaskSet:
    return SWETaskSet(section)


def _game_kind(name: str, summary: str, heldout: str, listing: GameListing) -> EnvKind:
    def tasks(section: Any, *, max_steps: int) -> TaskSet:
        return GameTaskSet(name, listing, section, max_steps=max_steps)

    return EnvKind(name=name, config=GameTaskConfig, summary=summary, heldout_split=heldout, success=game_won,
                   task_set=tasks, games=listing)


# The glue modules import game libraries (TextWorld, the WebShop catalog) on first use only.
def _alfworld() -> GameListing:
    def list_games(data: str | None, split: str) -> list[str]:
        from swerl.envs import alfworld

        return alfworld.list_games(data, split)

    def options(data: str | None, score_scale: float) -> GameOptions:
        from swerl.envs.alfworld import env as alfworld_env

        return alfworld_env.eval_options(data)

    def plans(ids: list[str], data: str | None) -> dict[str, list[str]]:
        from swerl.envs.alfworld import env as alfworld_env

        return alfworld_env.expert_plans(ids, data)

    return GameListing(list_games=list_games, options=options, expert_plans=plans)


def _webshop() -> GameListing:
    def list_games(data: str | None, split: str) -> list[str]:
        from swerl.envs.webshop import env

        return env.list_games(data, split)

    def options(data: str | None, score_scale: float) -> GameOptions:
        from swerl.envs.webshop import env

        return env.eval_options(data, score_scale=score_scale)

    def plans(ids: list[str], data: str | None) -> dict[str, list[str]]:
        from swerl.envs.webshop import env

        return env.expert_plans(ids, data)

    return GameListing(list_games=list_games, options=options, expert_plans=plans, pays_win_reward=False)


def _puzzle(kind: str) -> GameListing:
    def list_games(data: str | None, split: str) -> list[str]:
        from swerl.envs.games import env

        return env.list_games(kind, data, split)

    def options(data: str | None, score_scale: float) -> GameOptions:
        from swerl.envs.games import env

        return env.eval_options(kind, data)

    def plans(ids: list[str], data: str | None) -> dict[str, list[str]]:
        from swerl.envs.games import env

        return env.expert_plans(kind, ids, data)

    return GameListing(list_games=list_games, options=options, expert_plans=plans)


def _toy_vocab(section: Any) -> int:
    return int(section.vocab_size)


ENV_KINDS: tuple[EnvKind, ...] = (
    EnvKind(name="toy", config=ToyEnvConfig, summary="synthetic token game for tests", heldout_split="",
            success=toy_success, engine_game=EngineGame(vocab_size=_toy_vocab, rollouts=toy_step)),
    EnvKind(name="swe", config=SWETaskConfig, summary="SWE-bench-schema tasks in sandboxes",
            heldout_split="heldout", success=swe_success, task_set=_swe_tasks),
    _game_kind("alfworld", "ALFWorld household text games", "heldout", _alfworld()),
    _game_kind("webshop", "WebShop shopping goals", "test", _webshop()),
    _game_kind("sokoban", "generated Sokoban rooms", "heldout", _puzzle("sokoban")),
    _game_kind("frozenlake", "generated FrozenLake maps", "heldout", _puzzle("frozenlake")),
    _game_kind("sudoku", "generated Sudoku puzzles", "heldout", _puzzle("sudoku")),
)
"""Every env kind, in the order help and error messages list them."""

_BY_NAME = {k.name: k for k in ENV_KINDS}


def kind_names() -> tuple[str, ...]:
    """The names of every env kind."""
    return tuple(_BY_NAME)


def game_kind_names() -> tuple[str, ...]:
    """The names of the text-game kinds (those with a game listing)."""
    return tuple(k.name for k in ENV_KINDS if k.games is not None)


def env_kind(name: str, *, what: str = "env.kind") -> EnvKind:
    """The kind named `name`; an unknown name is a ValueError listing the kinds."""
    if name not in _BY_NAME:
        raise ValueError(f"{what} must be one of {kind_names()}, got {name!r}")
    return _BY_NAME[name]


def game_kind(name: str) -> tuple[EnvKind, GameListing]:
    """A text-game kind and its listing; any other name is a ValueError listing the text games."""
    kind = _BY_NAME.get(name)
    if kind is None or kind.games is None:
        raise ValueError(f"no text game {name!r}: one of {game_kind_names()}")
    return kind, kind.games
