"""FrozenLake: walk across a frozen lake from the start to the goal without falling into a hole.

The game is gymnasium's `FrozenLake-v1` (made with `gymnasium.make`, so its own transitions, step
limit and, when `slippery`, its own random slips); maps come from gymnasium's `generate_random_map`
(start top left, goal bottom right, a path between them guaranteed) with a seed drawn for the game id.
`slippery` is False by default: every move goes where it is meant to, so a game is a deterministic
maze and the expert's plan always wins. With `slippery=True` a move goes the intended way with
probability `success_rate` and to either side otherwise; the slips are drawn from a seed of the game
id, so replaying the same answers replays the same episode.

Text (`render`), one character per cell: `_` frozen (the start too), `O` hole, `G` goal, `P` player,
`X` player in a hole, `√` player on the goal (RAGEN's FrozenLake symbols).

Answers: `Up`, `Down`, `Left` or `Right` (case-insensitive). A move off the edge is a legal move that
changes nothing (gymnasium's rule); any other answer is invalid (a no-op the env penalises). Reaching
the goal wins; a hole, or gymnasium's step limit (100 moves), ends the game lost.

The expert (`shortest_path`, `FrozenLakeGame.expert_move`) is breadth-first search on the map with
this module's own transition model (`lake_move`); the tests check it against gymnasium's. On a
slippery lake it replans from wherever the player ended up, which may still fall into a hole.

Runs inside the text-game image: the standard library, `swerl.structs`, `swerl.envs.games.common`
and gymnasium (with numpy).
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import gymnasium
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from swerl.envs.games.common import (
    DELTAS,
    MOVES,
    PuzzleGame,
    config_from_kwargs,
    derive_seed,
    generate_in_split,
    parse_move,
)
from swerl.structs import GameObs

Cell = tuple[int, int]

GYM_ID = "FrozenLake-v1"
GYM_ACTIONS = {"Left": 0, "Down": 1, "Right": 2, "Up": 3}
"""gymnasium's action numbers of the moves."""
FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "_", "O", "G", "P", "X", "√"


@dataclass(frozen=True)
class FrozenLakeConfig:
    """How FrozenLake games are made (the game's keyword arguments)."""

    size: int = 4
    """Side of the square lake (RAGEN: 4)."""
    p: float = 0.8
    """Probability that a generated cell is frozen rather than a hole (gymnasium's and RAGEN's 0.8)."""
    slippery: bool = False
    """gymnasium's `is_slippery`: moves may slide sideways (see the module docstring)."""
    success_rate: float = 1.0 / 3.0
    """With `slippery`: probability that a move goes the intended way (gymnasium's default 1/3)."""
    train_games: int = 10_000
    """Game ids listed for the train split."""
    heldout_games: int = 100
    """Game ids listed for the held-out split."""

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"frozenlake: size must be >= 2, got {self.size}")
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"frozenlake: p is the frozen-cell probability, in (0, 1], got {self.p}")
        if not 0.0 <= self.success_rate <= 1.0:
            raise ValueError(f"frozenlake: success_rate must be in [0, 1], got {self.success_rate}")
        if self.train_games < 0 or self.heldout_games < 0:
            raise ValueError("frozenlake: train_games and heldout_games must be >= 0")


def lake_move(desc: tuple[str, ...], pos: Cell, move: str) -> Cell:
    """Where `move` takes the player from `pos` on a lake that does not slip (off the edge: nowhere)."""
    dr, dc = DELTAS[move]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < len(desc) and 0 <= c < len(desc[0]) else pos


def shortest_path(desc: tuple[str, ...], start: Cell = (0, 0)) -> list[str] | None:
    """The fewest moves from `start` to the goal that never step into a hole, or None."""
    if desc[start[0]][start[1]] == "G":
        return []
    parent: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        for move in MOVES:
            nxt = lake_move(desc, pos, move)
            if nxt in parent or desc[nxt[0]][nxt[1]] == "H":
                continue
            parent[nxt] = (pos, move)
            if desc[nxt[0]][nxt[1]] == "G":
                plan, node = [], nxt
                while (link := parent[node]) is not None:
                    node, m = link
                    plan.append(m)
                return plan[::-1]
            queue.append(nxt)
    return None


def render(desc: tuple[str, ...], pos: Cell) -> str:
    """The lake with the player at `pos`, one text line per row."""
    rows = []
    for r, line in enumerate(desc):
        out = []
        for c, tile in enumerate(line):
            if (r, c) == pos:
                out.append(PLAYER_IN_HOLE if tile == "H" else PLAYER_ON_GOAL if tile == "G" else PLAYER)
            else:
                out.append(HOLE if tile == "H" else GOAL if tile == "G" else FROZEN)
        rows.append("".join(out))
    return "\n".join(rows)


def generate_map(seed: int, size: int = 4, p: float = 0.8) -> tuple[str, ...]:
    """gymnasium's random map (rows of S, F, H, G) for `seed`."""
    return tuple(generate_random_map(size=size, p=p, seed=seed))


@lru_cache(maxsize=4096)
def game_map(cfg: FrozenLakeConfig, split: str, index: int) -> tuple[str, ...]:
    """The map of game `index` of `split` (cached)."""
    def make(seed: int) -> tuple[tuple[str, ...], str]:
        desc = generate_map(seed, cfg.size, cfg.p)
        return desc, render(desc, (0, 0))

    desc, _ = generate_in_split("frozenlake", split, index, make, f"{cfg.size}/{cfg.p}")
    return desc


def make_gym_env(desc: tuple[str, ...], *, slippery: bool = False, success_rate: float = 1.0 / 3.0) -> Any:
    """gymnasium's `FrozenLake-v1` on `desc` (its default wrappers: the step limit, order checks)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gymnasium.make(GYM_ID, desc=list(desc), is_slippery=slippery, success_rate=success_rate)


class FrozenLakeGame(PuzzleGame):
    """FrozenLake on the text-game protocol (see the module docstring); keyword arguments:
    `FrozenLakeConfig`."""

    kind = "frozenlake"
    admissible = MOVES

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.cfg = config_from_kwargs(FrozenLakeConfig, kwargs, self.kind)
        self.desc: tuple[str, ...] = ()
        self.pos: Cell = (0, 0)
        self._env: Any = None

    def _start(self, split: str, index: int) -> None:
        self.desc = game_map(self.cfg, split, index)
        self.close()
        self._env = make_gym_env(self.desc, slippery=self.cfg.slippery, success_rate=self.cfg.success_rate)
        state, _ = self._env.reset(seed=derive_seed("frozenlake-slips", split, index))
        self.pos = divmod(int(state), self.cfg.size)
        self.task = "Walk to the goal G without stepping into a hole O."
        if self.cfg.slippery:
            self.task += " The ice is slippery: a move may slide you sideways instead."
        plan = shortest_path(self.desc, self.pos)
        self._extra = (("optimal_moves", float(len(plan) if plan is not None else -1)),)

    def _render(self) -> str:
        return render(self.desc, self.pos)

    def _play(self, action: str) -> GameObs:
        move = parse_move(action)
        if move is None:
            return self._reply(f"{action.strip()[:60]!r} is not a move: answer with exactly one of Up, Down, "
                               f"Left, Right. Nothing happened.\n{self._render()}", valid=False)
        intended = lake_move(self.desc, self.pos, move)
        state, _, terminated, truncated, _ = self._env.step(GYM_ACTIONS[move])
        before, self.pos = self.pos, divmod(int(state), self.cfg.size)
        tile = self.desc[self.pos[0]][self.pos[1]]
        if self.pos != intended:
            event = f"You tried to move {move}, but the ice is slippery and you slid elsewhere."
        elif self.pos == before:
            event = f"You are at the edge of the lake: moving {move} changes nothing."
        else:
            event = f"You moved {move}."
        board = self._render()
        if tile == "G":
            return self._reply(f"{event} You reached the goal!\n{board}", won=True)
        if tile == "H":
            return self._reply(f"{event} You fell into a hole. Game over.\n{board}", done=True)
        if terminated or truncated:
            return self._reply(f"{event} The lake's step limit is reached. Game over.\n{board}", done=True)
        return self._reply(f"{event}\n{board}")

    def expert_move(self) -> str | None:
        plan = shortest_path(self.desc, self.pos)
        return plan[0] if plan else None

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
