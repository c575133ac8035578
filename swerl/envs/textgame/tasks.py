"""Text games as training tasks: ALFWorld games, WebShop goals or generated puzzles (Sokoban, FrozenLake,
Sudoku). Each episode plays the game through the text-game harness, inside a sandbox of the text-game
image (the game server driven over its line protocol) or in this process. Reward: the env's running
total (win / purchase score, minus invalid-action penalties); an episode that never acted validly scores 0.

`GameOptions` is what one game kind's glue (`eval_options` of `swerl.envs.alfworld.env`,
`swerl.envs.webshop.env`, `swerl.envs.games.env`) hands to training and evaluation; `GameListing` is the
kind's entry point for them in `swerl.envs.registry`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from swerl.agent.env import Env, EpisodeSpec
from swerl.envs.textgame.env import DEFAULT_PROMPT, TextGameConfig, TextGameEnv, TextGamePrompt
from swerl.envs.textgame.protocol import TextGame
from swerl.structs import SandboxSpec, Trajectory


class MakeGameEnv(Protocol):
    """Builds the agent env of one game: `TextGameEnv` or a kind's own subclass (WebShop pays for the
    purchase score, the puzzles want `<answer>` tags)."""

    def __call__(self, game: TextGame, game_id: str, prompt: TextGamePrompt,
                 config: TextGameConfig) -> Env: ...


def _one_group(game_id: str) -> str:
    return "all"


@dataclass(frozen=True)
class GameOptions:
    """How to play one game kind: built by the kind's `eval_options`, read by training and evaluation."""

    game_kwargs: dict[str, Any] = field(default_factory=dict)
    """The game's constructor arguments (JSON: they travel to the sandboxed server as they are)."""
    prompt: TextGamePrompt = DEFAULT_PROMPT
    """The wording of the episode."""
    config: TextGameConfig = field(default_factory=TextGameConfig)
    """The kind's default rewards and step budget."""
    make_env: MakeGameEnv = TextGameEnv
    """The env class (or factory) of the game."""
    group_of: Callable[[str], str] = _one_group
    """A game id's group in evaluation reports (ALFWorld: task type; WebShop: category)."""


@dataclass(frozen=True)
class GameListing:
    """A text-game kind's games and glue, as the registry holds it."""

    list_games: Callable[[str | None, str], list[str]]
    """list_games(data, split): the game ids of one split of a data folder (None: the shipped set)."""
    options: Callable[[str | None, float], GameOptions]
    """options(data, score_scale): how to play the games of `data`."""
    expert_plans: Callable[[list[str], str | None], dict[str, list[str]]]
    """expert_plans(game_ids, data): each game's expert actions keyed by text of its prompt
    (`ExpertEngine`)."""
    pays_win_reward: bool = True
    """Whether `win_reward` is the kind's reward (False: WebShop pays score_scale × the purchase score)."""


@dataclass(frozen=True)
class GameTaskConfig:
    """Text-game tasks for training (config sections `env.alfworld` / `env.webshop`)."""

    data: str = ""
    """Game data: ALFWorld's data folder (generated set or the official json_2.1.1 layout) / the WebShop
    catalog folder; empty: the set shipped under tasks/. Puzzle games (sokoban, frozenlake, sudoku): their
    generator options, `name=value,...` (e.g. `dim=7,boxes=2`); empty: the defaults."""
    split: str = "train"
    """Split to train on (ALFWorld: train / heldout, official: train / valid_seen; WebShop: train / test;
    puzzle games: train / heldout)."""
    limit: int = 0
    """Keep the first N games of the split (0: all)."""
    sandbox: bool = True
    """Play each game inside a sandbox of the text-game image (False: in this process)."""
    win_reward: float = 10.0
    """ALFWorld and the puzzle games: reward for winning (verl-agent: 10). WebShop pays score_scale × purchase
    score instead."""
    score_scale: float = 10.0
    """WebShop: reward per unit of purchase score."""
    invalid_penalty: float = 0.1
    """Subtracted for each action that is not admissible."""
    latency_median_s: float = 0.0
    """Injected env time per episode, for benchmarks of long-tail rollouts (scripts/bench_async.py): each
    episode waits, after it ends, a time drawn from a lognormal with this median and `latency_sigma`
    (`EpisodeSpec.latency_s`), from a generator seeded by the task id and how many of its groups came
    before, so the run's seeded task stream fixes the draws. 0: none (nothing is drawn)."""
    latency_sigma: float = 1.0
    """σ of the log of that latency (1.0: the slowest of 64 episodes takes ~10× the median)."""

    def __post_init__(self) -> None:
        if self.limit < 0 or self.invalid_penalty < 0 or self.score_scale < 0:
            raise ValueError("env.<game>.limit, invalid_penalty and score_scale must be >= 0")
        if not (self.latency_median_s >= 0 and self.latency_sigma >= 0):  # NaN too
            raise ValueError(f"env.<game>.latency_median_s and latency_sigma must be >= 0, got "
                             f"{self.latency_median_s} and {self.latency_sigma}")


class GameTaskSet:
    """The games of one text-game kind as training tasks (see the module docstring). `max_steps` is the
    episode's turn budget (the loop's rollout.max_turns)."""

    def __init__(self, kind: str, games: GameListing, cfg: GameTaskConfig, *, max_steps: int) -> None:
        ids = games.list_games(cfg.data or None, cfg.split)
        ids = ids[:cfg.limit] if cfg.limit else ids
        if not ids:
            raise ValueError(f"env.{kind}: no games in split {cfg.split!r} of "
                             f"{cfg.data or 'the shipped set'}")
        opts = games.options(cfg.data or None, cfg.score_scale)
        self.kind, self.sandbox = kind, cfg.sandbox
        self.ids = tuple(ids)
        self.options = dataclasses.replace(opts, config=dataclasses.replace(
            opts.config, invalid_penalty=cfg.invalid_penalty, max_steps=max_steps,
            **({"win_reward": cfg.win_reward} if games.pays_win_reward else {})))
        self._image: str | None = None
        self._lock = threading.Lock()
        self._latency = (cfg.latency_median_s, cfg.latency_sigma)
        self._groups_of: dict[str, int] = {}  # task id -> groups of it specified so far (latency seeds)

    @classmethod
    def of(cls, kind: str, game_ids: Sequence[str], options: GameOptions, *,
           image: str | None) -> GameTaskSet:
        """Exactly these games, played as `options` say, in sandboxes of `image` (None: in this process):
        `swerl eval game` selects the games, rewards and budget with its own flags."""
        if not game_ids:
            raise ValueError(f"{kind}: no games to evaluate")
        if len(set(game_ids)) != len(game_ids):
            raise ValueError(f"{kind}: the game list names a game twice")
        self = cls.__new__(cls)
        self.kind, self.sandbox = kind, image is not None
        self.ids, self.options = tuple(game_ids), options
        self._image, self._lock = image, threading.Lock()
        self._latency, self._groups_of = (0.0, 1.0), {}
        return self

    @property
    def config(self) -> TextGameConfig:
        """The episodes' rewards and budget (the kind's defaults, then this section's)."""
        return self.options.config

    def prepare(self, task_ids: Sequence[str]) -> None:
        if self.sandbox:
            from swerl.envs.textgame.image import build_textgame_image

            with self._lock:
                if self._image is None:
                    self._image = build_textgame_image()

    @property
    def image(self) -> str | None:
        """The text-game image the games run in (after `prepare`); None: they run in this process."""
        return self._image

    def specs(self, task_id: str, group: int, n: int) -> list[EpisodeSpec]:
        from swerl.envs.textgame.client import open_game

        self.prepare([task_id])
        kind, o = self.kind, self.options

        def make_env(sb: Any) -> Env:
            return o.make_env(open_game(kind, sb, **o.game_kwargs), task_id, o.prompt, o.config)

        sandbox = SandboxSpec(image=self._image) if self._image else None
        latencies = self._latencies(task_id, n)
        return [EpisodeSpec(task_id=task_id, group=group, sample=s, make_env=make_env, sandbox=sandbox,
                            finish=_score_unacted, latency_s=lat) for s, lat in enumerate(latencies)]

    def _latencies(self, task_id: str, n: int) -> list[float]:
        """The injected env time of each of a group's `n` episodes (`latency_median_s`; zeros when 0)."""
        median, sigma = self._latency
        if not median:
            return [0.0] * n
        with self._lock:
            k = self._groups_of.get(task_id, 0)
            self._groups_of[task_id] = k + 1
        rng = random.Random(f"{self.kind}/{task_id}/{k}")
        return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def game_won(trajectory: Trajectory) -> bool:
    """The game reported a win (its last `GameObs.won`)."""
    return trajectory.stop_reason == "won"


def _score_unacted(env: Any, trajectory: Trajectory) -> Trajectory:
    """An episode that never acted validly (every turn malformed) has no env reward yet: it scores 0.
    (The runner closes the game, finished or failed, through `TextGameEnv.close`.)"""
    return trajectory if trajectory.reward is not None else dataclasses.replace(trajectory, reward=0.0)
