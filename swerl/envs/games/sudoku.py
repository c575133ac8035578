"""Sudoku on small grids: fill the empty cells so that every row, column and box holds each value once.

Generation (`generate_puzzle`, from a seed): a random complete grid (backtracking with the values of
each cell tried in a random order), then cells are emptied one by one in a random order, each only if
the puzzle keeps exactly one solution (`count_solutions`), until `clues` givens are left or no further
cell can go. Every puzzle therefore has a unique solution, which `solve` finds.

Grids: `size` 4 (2x2 boxes, the default), 6 (2x3), 8 (2x4) or 9 (3x3); values 1..size.

Text (`render`): column numbers on top, row numbers on the left, `.` for an empty cell, `|` and `-`
between boxes, e.g. for 4x4:

        1 2   3 4
     1  1 . | . 4
     2  . . | 2 .
        ----+----
     3  . 3 | . .
     4  4 . | . 1

Answers: `ROW COL VALUE`, three numbers counted from 1, separated by spaces or commas: `2 3 4` puts a
4 in row 2, column 3. A placement is legal when the cell is empty and the value is not already in its
row, column or box; anything else is invalid (a no-op the env penalises) and the reply says why:
not three numbers, a number out of range, a filled cell (given or placed), or the clashing cell.
Placed values cannot be changed. The game is won when every cell is filled (every placement was
legal, so the grid is a solution). With `end_when_stuck` (default), a legal placement that leaves an
empty cell with no value it could still take ends the game lost: the grid can no longer be finished.

Runs inside the text-game image: standard library, `swerl.structs` and `swerl.envs.games.common`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from swerl.envs.games.common import PuzzleGame, config_from_kwargs, generate_in_split
from swerl.structs import GameObs

Grid = tuple[int, ...]
"""A grid, row by row; 0 is an empty cell."""

BOX_SHAPES = {4: (2, 2), 6: (2, 3), 8: (2, 4), 9: (3, 3)}
"""(box rows, box columns) of each supported grid size."""


@dataclass(frozen=True)
class SudokuConfig:
    """How Sudoku puzzles are generated and played (the game's keyword arguments)."""

    size: int = 4
    """Side of the grid: 4, 6, 8 or 9."""
    clues: int = 6
    """Givens the generator aims for (it stops above when no further cell can be emptied uniquely)."""
    end_when_stuck: bool = True
    """End the game lost when an empty cell has no value left it could take."""
    train_games: int = 10_000
    """Game ids listed for the train split."""
    heldout_games: int = 100
    """Game ids listed for the held-out split."""

    def __post_init__(self) -> None:
        if self.size not in BOX_SHAPES:
            raise ValueError(f"sudoku: size must be one of {', '.join(map(str, BOX_SHAPES))}, got "
                             f"{self.size}")
        if not 0 <= self.clues < self.size * self.size:
            raise ValueError(f"sudoku: clues must be in 0..{self.size * self.size - 1}, got {self.clues}")
        if self.train_games < 0 or self.heldout_games < 0:
            raise ValueError("sudoku: train_games and heldout_games must be >= 0")


@dataclass(frozen=True)
class Puzzle:
    """A Sudoku puzzle and its (unique) solution."""

    size: int
    """Side of the grid."""
    givens: Grid
    """The puzzle, row by row (0: empty)."""
    solution: Grid
    """The solution, row by row."""

    def __post_init__(self) -> None:
        n = self.size * self.size
        if self.size not in BOX_SHAPES or len(self.givens) != n or len(self.solution) != n:
            raise ValueError(f"a {self.size}x{self.size} Sudoku needs {n} cells in givens and solution")
        if any(g and g != s for g, s in zip(self.givens, self.solution, strict=True)):
            raise ValueError("a Sudoku's givens must agree with its solution")


def _peers(size: int) -> tuple[tuple[int, ...], ...]:
    br, bc = BOX_SHAPES[size]
    out = []
    for i in range(size * size):
        r, c = divmod(i, size)
        r0, c0 = r - r % br, c - c % bc
        cells = {r * size + k for k in range(size)} | {k * size + c for k in range(size)}
        cells |= {(r0 + a) * size + c0 + b for a in range(br) for b in range(bc)}
        out.append(tuple(sorted(cells - {i})))
    return tuple(out)


_PEERS = {size: _peers(size) for size in BOX_SHAPES}


def candidates(grid: Grid, size: int, cell: int) -> list[int]:
    """Values `cell` could take: those not in its row, column or box."""
    used = {grid[p] for p in _PEERS[size][cell]}
    return [v for v in range(1, size + 1) if v not in used]


def _search(grid: list[int], size: int, limit: int, found: list[Grid]) -> None:
    best, best_vals = -1, None
    for i, v in enumerate(grid):
        if v == 0:
            vals = candidates(tuple(grid), size, i)
            if best_vals is None or len(vals) < len(best_vals):
                best, best_vals = i, vals
                if len(vals) <= 1:
                    break
    if best_vals is None:
        found.append(tuple(grid))
        return
    for v in best_vals:
        grid[best] = v
        _search(grid, size, limit, found)
        if len(found) >= limit:
            break
    grid[best] = 0


def _consistent(grid: Grid, size: int) -> bool:
    return all(v == 0 or v not in {grid[p] for p in _PEERS[size][i]} for i, v in enumerate(grid))


def count_solutions(grid: Grid, size: int, limit: int = 2) -> int:
    """How many solutions `grid` has, counting up to `limit`."""
    if not _consistent(grid, size):
        return 0
    found: list[Grid] = []
    _search(list(grid), size, limit, found)
    return len(found)


def solve(grid: Grid, size: int) -> Grid | None:
    """A solution of `grid` (the solution, for a generated puzzle), or None."""
    if not _consistent(grid, size):
        return None
    found: list[Grid] = []
    _search(list(grid), size, 1, found)
    return found[0] if found else None


def _fill(rng: random.Random, grid: list[int], size: int, cell: int) -> bool:
    if cell == len(grid):
        return True
    vals = candidates(tuple(grid), size, cell)
    rng.shuffle(vals)
    for v in vals:
        grid[cell] = v
        if _fill(rng, grid, size, cell + 1):
            return True
    grid[cell] = 0
    return False


def generate_puzzle(seed: int, size: int = 4, clues: int = 6) -> Puzzle:
    """A puzzle with a unique solution from `seed` (see the module docstring)."""
    rng = random.Random(seed)
    full = [0] * (size * size)
    if not _fill(rng, full, size, 0):
        # cannot happen: every size has one
        raise RuntimeError(f"sudoku: could not fill a {size}x{size} grid")
    grid = list(full)
    order = list(range(size * size))
    rng.shuffle(order)
    givens = len(grid)
    for cell in order:
        if givens <= clues:
            break
        grid[cell] = 0
        if count_solutions(tuple(grid), size, 2) == 1:
            givens -= 1
        else:
            grid[cell] = full[cell]
    return Puzzle(size, tuple(grid), tuple(full))


def render(grid: Grid, size: int) -> str:
    """The grid as text (see the module docstring)."""
    br, bc = BOX_SHAPES[size]
    groups = [range(g * bc, (g + 1) * bc) for g in range(size // bc)]
    width = len(str(size))
    lines = ["    " + "   ".join(" ".join(str(c + 1) for c in g) for g in groups)]
    for r in range(size):
        if r and r % br == 0:
            lines.append("    " + "-+-".join("-" * (2 * bc - 1) for _ in groups))
        cells = " | ".join(" ".join(str(grid[r * size + c]) if grid[r * size + c] else "." for c in g)
                           for g in groups)
        lines.append(f"{r + 1:>{width + 1}}  {cells}")
    return "\n".join(lines)


@lru_cache(maxsize=4096)
def game_puzzle(cfg: SudokuConfig, split: str, index: int) -> Puzzle:
    """The puzzle of game `index` of `split` (cached)."""
    def make(seed: int) -> tuple[Puzzle, str]:
        puzzle = generate_puzzle(seed, cfg.size, cfg.clues)
        return puzzle, render(puzzle.givens, cfg.size)

    puzzle, _ = generate_in_split("sudoku", split, index, make, f"{cfg.size}/{cfg.clues}")
    return puzzle


def parse_placement(action: str) -> tuple[int, int, int] | None:
    """(row, column, value) as written (counted from 1) when the answer is three whole numbers."""
    parts = [p for p in re.split(r"[\s,]+", action.strip().rstrip(".")) if p]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    r, c, v = (int(p) for p in parts)
    return r, c, v


class SudokuGame(PuzzleGame):
    """Sudoku on the text-game protocol (see the module docstring); keyword arguments: `SudokuConfig`."""

    kind = "sudoku"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.cfg = config_from_kwargs(SudokuConfig, kwargs, self.kind)
        self.puzzle: Puzzle | None = None
        self.grid: Grid = ()

    def _start(self, split: str, index: int) -> None:
        self.puzzle = game_puzzle(self.cfg, split, index)
        self.grid = self.puzzle.givens
        n = self.cfg.size
        br, bc = BOX_SHAPES[n]
        self.task = (f"Fill every empty cell (.) with a value from 1 to {n} so that each row, each column "
                     f"and each {br}x{bc} box holds every value exactly once.")
        self._extra = (("empty_cells", float(self.grid.count(0))),)

    def _render(self) -> str:
        return render(self.grid, self.cfg.size)

    def _invalid(self, why: str) -> GameObs:
        return self._reply(f"{why} Nothing changed.\n{self._render()}", valid=False)

    def _play(self, action: str) -> GameObs:
        assert self.puzzle is not None
        n = self.cfg.size
        move = parse_placement(action)
        if move is None:
            return self._invalid(f"{action.strip()[:60]!r} is not a placement: answer ROW COL VALUE, three "
                                 f"numbers from 1 to {n} (e.g. '1 2 3' puts 3 in row 1, column 2).")
        r, c, v = move
        for name, x in (("row", r), ("column", c), ("value", v)):
            if not 1 <= x <= n:
                return self._invalid(f"There is no {name} {x}: rows, columns and values run from 1 to {n}.")
        cell = (r - 1) * n + (c - 1)
        if self.grid[cell]:
            how = "given" if self.puzzle.givens[cell] else "placed earlier"
            return self._invalid(f"Row {r}, column {c} already holds {self.grid[cell]} ({how}); placed "
                                 "values cannot be changed.")
        clash = next((p for p in _PEERS[n][cell] if self.grid[p] == v), None)
        if clash is not None:
            pr, pc = divmod(clash, n)
            where = "row" if pr == r - 1 else "column" if pc == c - 1 else "box"
            return self._invalid(f"{v} cannot go in row {r}, column {c}: its {where} already has a {v} (row "
                                 f"{pr + 1}, column {pc + 1}).")
        grid = list(self.grid)
        grid[cell] = v
        self.grid = tuple(grid)
        event = f"You put {v} in row {r}, column {c}."
        if 0 not in self.grid:
            return self._reply(f"{event} Every cell is filled: solved!\n{self._render()}", won=True)
        if self.cfg.end_when_stuck:
            dead = next((i for i, x in enumerate(self.grid) if x == 0 and not candidates(self.grid, n, i)),
                        None)
            if dead is not None:
                dr, dc = divmod(dead, n)
                return self._reply(f"{event} Row {dr + 1}, column {dc + 1} can no longer take any value, so "
                                   f"the grid cannot be finished. Game over.\n{self._render()}", done=True)
        return self._reply(f"{event}\n{self._render()}")

    def expert_move(self) -> str | None:
        n = self.cfg.size
        solution = solve(self.grid, n)
        if solution is None:
            return None
        cell = next((i for i, x in enumerate(self.grid) if x == 0), None)
        if cell is None:
            return None
        r, c = divmod(cell, n)
        return f"{r + 1} {c + 1} {solution[cell]}"
