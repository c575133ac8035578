"""Sokoban: push every box onto a target in a small walled room.

Generation (`generate_room`, from a seed): a random walk carves the floor out of a `dim` x `dim` block
of wall; the boxes start on randomly chosen targets with the player on another floor cell; then the
game is played backwards for `reverse_steps` random moves, in which the player walks and, where a box
lies behind it, pulls it along (a pull is a push played backwards, so the room stays solvable). The
result is kept only when the breadth-first solver (`solve`) confirms it and its shortest solution
has between `min_moves` and `max_moves` moves; otherwise the next try of the same seed is made.

Text (`render`), one character per cell: `#` wall, `_` floor, `O` target, `X` box, `√` box on a
target, `P` player, `S` player on a target (the symbols RAGEN's Sokoban uses).

Answers: `Up`, `Down`, `Left` or `Right` (case-insensitive). Walking into a box pushes it one cell
when the cell behind it is floor; a move into a wall, or a push against a wall or another box, is a
legal move that changes nothing. Any other answer is invalid (a no-op the env penalises). The game
is won when every box is on a target; it does not end otherwise (the step budget does).

Runs inside the text-game image: standard library, `swerl.structs` and `swerl.envs.games.common`.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from swerl.envs.games.common import (
    DELTAS,
    MOVES,
    PuzzleGame,
    config_from_kwargs,
    generate_in_split,
    parse_move,
)
from swerl.structs import GameObs

Cell = tuple[int, int]

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"


@dataclass(frozen=True)
class SokobanConfig:
    """How Sokoban rooms are generated (the game's keyword arguments)."""

    dim: int = 6
    """Side of the square room, walls included (RAGEN: 6)."""
    boxes: int = 1
    """Boxes (and targets) per room (RAGEN: 1)."""
    walk_steps: int = 0
    """Steps of the random walk that carves the floor; 0: 3 x (dim - 2)^2."""
    reverse_steps: int = 30
    """Random backward moves (walks and pulls) from the solved state."""
    reverse_plays: int = 8
    """Backward plays per carved room; the one with the longest shortest solution (within max_moves) is
    kept."""
    min_moves: int = 4
    """Shortest solutions below this many moves are rejected (too easy)."""
    max_moves: int = 20
    """Shortest solutions above this many moves are rejected, so the expert fits the step budget."""
    max_states: int = 200_000
    """The solver gives up beyond this many visited states (the room counts as unsolvable)."""
    train_games: int = 10_000
    """Game ids listed for the train split."""
    heldout_games: int = 100
    """Game ids listed for the held-out split."""

    def __post_init__(self) -> None:
        if self.dim < 4:
            raise ValueError("sokoban: dim must be >= 4 (a wall border around at least 2x2 floor), got "
                             f"{self.dim}")
        if not 1 <= self.boxes <= (self.dim - 2) ** 2 // 3:
            raise ValueError(f"sokoban: boxes must be between 1 and {(self.dim - 2) ** 2 // 3} in a "
                             f"{self.dim}x{self.dim} room, got {self.boxes}")
        if self.walk_steps < 0 or self.reverse_steps < 1 or self.reverse_plays < 1:
            raise ValueError("sokoban: walk_steps must be >= 0, reverse_steps and reverse_plays >= 1")
        if not 1 <= self.min_moves <= self.max_moves:
            raise ValueError(f"sokoban: need 1 <= min_moves <= max_moves, got {self.min_moves} and "
                             f"{self.max_moves}")
        if self.max_states < 1 or self.train_games < 0 or self.heldout_games < 0:
            raise ValueError("sokoban: max_states must be >= 1, train_games and heldout_games >= 0")


@dataclass(frozen=True)
class Room:
    """A Sokoban puzzle: the fixed layout and the starting positions."""

    dim: int
    """Side of the square room."""
    walls: frozenset[Cell]
    """Wall cells (the border included)."""
    targets: frozenset[Cell]
    """Target cells."""
    boxes: frozenset[Cell]
    """Box cells at the start."""
    player: Cell
    """The player's cell at the start."""

    def __post_init__(self) -> None:
        if len(self.boxes) != len(self.targets) or not self.boxes:
            raise ValueError(f"a room needs as many boxes as targets (at least one), got {len(self.boxes)} "
                             f"and {len(self.targets)}")
        if self.player in self.boxes or self.player in self.walls or self.boxes & self.walls:
            raise ValueError("a room's player and boxes must stand on floor, apart")


def render(room: Room, player: Cell, boxes: frozenset[Cell]) -> str:
    """The room with the player and boxes at the given cells, one text line per row."""
    rows = []
    for r in range(room.dim):
        line = []
        for c in range(room.dim):
            cell, on_target = (r, c), (r, c) in room.targets
            if cell in room.walls:
                line.append(WALL)
            elif cell == player:
                line.append(PLAYER_ON_TARGET if on_target else PLAYER)
            elif cell in boxes:
                line.append(BOX_ON_TARGET if on_target else BOX)
            else:
                line.append(TARGET if on_target else FLOOR)
        rows.append("".join(line))
    return "\n".join(rows)


def push(room: Room, player: Cell, boxes: frozenset[Cell], move: str) -> tuple[Cell, frozenset[Cell], str]:
    """(player, boxes, what happened) after `move`; what happened is `moved`, `pushed` or `blocked`."""
    dr, dc = DELTAS[move]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in room.walls:
        return player, boxes, "blocked"
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in room.walls or beyond in boxes:
            return player, boxes, "blocked"
        return nxt, (boxes - {nxt}) | {beyond}, "pushed"
    return nxt, boxes, "moved"


def _dead_cells(room: Room) -> frozenset[Cell]:
    """Floor corners that are not targets: a box pushed there can never move again."""
    dead = set()
    for r in range(room.dim):
        for c in range(room.dim):
            cell = (r, c)
            if cell in room.walls or cell in room.targets:
                continue
            vertical = (r - 1, c) in room.walls or (r + 1, c) in room.walls
            horizontal = (r, c - 1) in room.walls or (r, c + 1) in room.walls
            if vertical and horizontal:
                dead.add(cell)
    return frozenset(dead)


def solve(room: Room, player: Cell | None = None, boxes: frozenset[Cell] | None = None, *,
          max_states: int = 200_000) -> list[str] | None:
    """A shortest solution (fewest moves) from the given state (default: the room's start) by
    breadth-first search, or None when there is none within `max_states` visited states."""
    start = (room.player if player is None else player, room.boxes if boxes is None else boxes)
    if start[1] <= room.targets:
        return []
    dead = _dead_cells(room)
    parent: dict[tuple[Cell, frozenset[Cell]],
                 tuple[tuple[Cell, frozenset[Cell]], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        for move in MOVES:
            p, b, what = push(room, state[0], state[1], move)
            if what == "blocked" or (p, b) in parent:
                continue
            if what == "pushed" and b & dead:
                continue
            parent[(p, b)] = (state, move)
            if b <= room.targets:
                plan, node = [], (p, b)
                while (link := parent[node]) is not None:
                    node, m = link
                    plan.append(m)
                return plan[::-1]
            if len(parent) >= max_states:
                return None
            queue.append((p, b))
    return None


def _carve(rng: random.Random, dim: int, steps: int) -> set[Cell]:
    inner = [(r, c) for r in range(1, dim - 1) for c in range(1, dim - 1)]
    pos = rng.choice(inner)
    floor = {pos}
    move = rng.choice(MOVES)
    for _ in range(steps):
        if rng.random() < 0.35:
            move = rng.choice(MOVES)
        dr, dc = DELTAS[move]
        nxt = (pos[0] + dr, pos[1] + dc)
        if 1 <= nxt[0] <= dim - 2 and 1 <= nxt[1] <= dim - 2:
            pos = nxt
            floor.add(pos)
    return floor


def _reverse_play(rng: random.Random, floor: set[Cell], targets: list[Cell], player: Cell,
                  steps: int) -> tuple[Cell, frozenset[Cell]]:
    boxes = set(targets)
    move = rng.choice(MOVES)
    for _ in range(steps):
        if rng.random() < 0.5:  # half the time keep going the same way, so a pulled box travels
            move = rng.choice(MOVES)
        dr, dc = DELTAS[move]
        nxt = (player[0] + dr, player[1] + dc)
        if nxt not in floor or nxt in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rng.random() < 0.8:  # pull the box along (a push, backwards)
            boxes.remove(behind)
            boxes.add(player)
        player = nxt
    return player, frozenset(boxes)


def generate_room(seed: int, cfg: SokobanConfig = SokobanConfig()) -> tuple[Room, list[str]]:
    """(room, a shortest solution) generated from `seed` (see the module docstring)."""
    rng = random.Random(seed)
    dim = cfg.dim
    steps = cfg.walk_steps or 3 * (dim - 2) ** 2
    for _ in range(1000):
        floor = _carve(rng, dim, steps)
        if len(floor) < 2 * cfg.boxes + 2:
            continue
        cells = sorted(floor)
        targets = rng.sample(cells, cfg.boxes)
        walls = frozenset((r, c) for r in range(dim) for c in range(dim)) - floor
        best: tuple[Room, list[str]] | None = None
        for _ in range(cfg.reverse_plays):
            start = rng.choice([c for c in cells if c not in targets])
            player, boxes = _reverse_play(rng, floor, targets, start, cfg.reverse_steps)
            if boxes == frozenset(targets):
                continue
            room = Room(dim, walls, frozenset(targets), boxes, player)
            plan = solve(room, max_states=cfg.max_states)
            if plan is not None and len(plan) <= cfg.max_moves and (best is None or len(plan) > len(best[1])):
                best = room, plan
        if best is not None and len(best[1]) >= cfg.min_moves:
            return best
    raise RuntimeError(f"sokoban: seed {seed} gave no room within {cfg.min_moves}..{cfg.max_moves} moves in "
                       "1000 tries; widen the move range or change dim / boxes / reverse_steps")


def _salt(cfg: SokobanConfig) -> str:
    return "/".join(str(x) for x in (cfg.dim, cfg.boxes, cfg.walk_steps, cfg.reverse_steps, cfg.reverse_plays,
                                      cfg.min_moves, cfg.max_moves))


@lru_cache(maxsize=4096)
def game_room(cfg: SokobanConfig, split: str, index: int) -> tuple[Room, tuple[str, ...]]:
    """The room of game `index` of `split` and a shortest solution (cached)."""
    def make(seed: int) -> tuple[tuple[Room, list[str]], str]:
        room, plan = generate_room(seed, cfg)
        return (room, plan), render(room, room.player, room.boxes)

    (room, plan), _ = generate_in_split("sokoban", split, index, make, _salt(cfg))
    return room, tuple(plan)


class SokobanGame(PuzzleGame):
    """Sokoban on the text-game protocol (see the module docstring); keyword arguments: `SokobanConfig`."""

    kind = "sokoban"
    admissible = MOVES

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.cfg = config_from_kwargs(SokobanConfig, kwargs, self.kind)
        self.room: Room | None = None
        self.player: Cell = (0, 0)
        self.boxes: frozenset[Cell] = frozenset()
        self._plans: dict[tuple[Cell, frozenset[Cell]], tuple[str, ...] | None] = {}

    def _start(self, split: str, index: int) -> None:
        self.room, plan = game_room(self.cfg, split, index)
        self.player, self.boxes = self.room.player, self.room.boxes
        self._plans = {(self.player, self.boxes): plan}
        n = self.cfg.boxes
        self.task = ("Push the box onto the target."
                     if n == 1 else f"Push all {n} boxes onto the {n} targets.")
        self._extra = (("optimal_moves", float(len(plan))),)

    def _render(self) -> str:
        assert self.room is not None
        return render(self.room, self.player, self.boxes)

    def _on_targets(self) -> int:
        assert self.room is not None
        return len(self.boxes & self.room.targets)

    def _play(self, action: str) -> GameObs:
        assert self.room is not None
        move = parse_move(action)
        if move is None:
            return self._reply(f"{action.strip()[:60]!r} is not a move: answer with exactly one of Up, Down, "
                               f"Left, Right. Nothing happened.\n{self._render()}", valid=False)
        before = self._on_targets()
        self.player, self.boxes, what = push(self.room, self.player, self.boxes, move)
        after = self._on_targets()
        if what == "blocked":
            event = f"You cannot move {move}: the way is blocked, so nothing moved."
        elif what == "moved":
            event = f"You moved {move}."
        elif after > before:
            event = f"You pushed a box {move} onto a target."
        elif after < before:
            event = f"You pushed a box {move}, off its target."
        else:
            event = f"You pushed a box {move}."
        won = after == len(self.room.targets)
        if won:
            return self._reply(f"{event} Every box is on a target: solved!\n{self._render()}", won=True)
        return self._reply(f"{event}\n{self._render()}")

    def expert_move(self) -> str | None:
        assert self.room is not None
        state = (self.player, self.boxes)
        if state not in self._plans:
            found = solve(self.room, self.player, self.boxes, max_states=self.cfg.max_states)
            self._plans[state] = tuple(found) if found is not None else None
        plan = self._plans[state]
        if not plan:
            return None
        p, b, _ = push(self.room, self.player, self.boxes, plan[0])
        self._plans.setdefault((p, b), plan[1:])
        return plan[0]

