"""What the generated puzzle games share: game ids, seeds, disjoint splits, move parsing, options, and
the `PuzzleGame` base class that implements the text-game protocol around a game's own rules.

Game ids and splits. A game id is `SPLIT-INDEX` (`train-00017`, `heldout-00003`; any number of
digits). The game behind it is found by trying the seeds `derive_seed(kind, options, split, index,
attempt)` for attempt 0, 1, 2, ... and keeping the first puzzle whose content hash (`split_of`, over
the kind and the puzzle's opening observation) falls in `split`. So the same id gives the same puzzle
on every machine and in every process, and no puzzle is in both splits, whatever the generator
options: a puzzle's split is a function of the puzzle alone, even where two seeds make the same one.

Runs inside the text-game image: standard library and `swerl.structs` only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from swerl.structs import GameObs

TRAIN_SPLIT = "train"
HELDOUT_SPLIT = "heldout"
"""The held-out split of every puzzle game (the default of evaluations)."""
SPLITS = (TRAIN_SPLIT, HELDOUT_SPLIT)
HELDOUT_SHARE = 0.5
"""Share of all puzzles (by content hash) that belong to the held-out split."""
MAX_ATTEMPTS = 10_000
"""Seeds tried for one game id before giving up (a generator that never lands in a split is a bug)."""

MOVES = ("Up", "Down", "Left", "Right")
"""The moves of the grid games (Sokoban, FrozenLake), as the model writes them."""
DELTAS: dict[str, tuple[int, int]] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
"""(row, column) change of each move."""

_ID_RE = re.compile(r"^(train|heldout)-(\d+)$")

T = TypeVar("T")
C = TypeVar("C")


def format_game_id(split: str, index: int) -> str:
    """The id of game `index` of `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the puzzle games have {', '.join(SPLITS)}")
    if index < 0:
        raise ValueError(f"a game index must be >= 0, got {index}")
    return f"{split}-{index:05d}"


def list_split(split: str, train_games: int, heldout_games: int) -> list[str]:
    """The ids listed for `split`: the first `train_games` / `heldout_games` games."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the puzzle games have {', '.join(SPLITS)}")
    n = train_games if split == TRAIN_SPLIT else heldout_games
    return [format_game_id(split, i) for i in range(n)]


def parse_game_id(game_id: str) -> tuple[str, int]:
    """(split, index) of a game id."""
    m = _ID_RE.match(game_id)
    if not m:
        raise ValueError(f"bad puzzle game id {game_id!r}: expected train-N or heldout-N (e.g. train-00017)")
    return m.group(1), int(m.group(2))


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes and Python versions, unlike hash())."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def split_of(kind: str, content: str) -> str:
    """The split a puzzle belongs to, decided by the hash of its content."""
    h = int.from_bytes(hashlib.sha256(f"{kind}\0{content}".encode()).digest()[:8], "big")
    return HELDOUT_SPLIT if h < HELDOUT_SHARE * 2**64 else TRAIN_SPLIT


def generate_in_split(kind: str, split: str, index: int, make: Callable[[int], tuple[T, str]],
                      salt: str = "") -> tuple[T, int]:
    """(puzzle, seed) of game `index` of `split`: `make(seed)` returns a puzzle and its content text;
    the first seed whose puzzle lands in `split` wins. `salt` (e.g. the generator options) makes other
    options draw other seeds."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the puzzle games have {', '.join(SPLITS)}")
    for attempt in range(MAX_ATTEMPTS):
        seed = derive_seed(kind, salt, split, index, attempt)
        puzzle, content = make(seed)
        if split_of(kind, content) == split:
            return puzzle, seed
    raise RuntimeError(f"{kind}: no puzzle of split {split} in {MAX_ATTEMPTS} seeds (game {index})")


def parse_move(action: str) -> str | None:
    """The move an answer names (`up`, ` Left `, `RIGHT.` are accepted), or None."""
    word = action.strip().rstrip(".").strip().lower()
    return next((m for m in MOVES if m.lower() == word), None)


def config_from_kwargs(cls: type[C], kwargs: dict[str, Any], kind: str) -> C:
    """A game's config dataclass from JSON keyword arguments; an unknown name is a one-line error."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ValueError(f"{kind}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return cls(**kwargs)


def parse_options(text: str | None, cls: type, kind: str) -> dict[str, Any]:
    """Generator options written `name=value,name=value` (e.g. `dim=7,boxes=2`), typed by the fields of
    the game's config dataclass; empty or None: no options (the defaults)."""
    if not text or not text.strip():
        return {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for item in text.split(","):
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or name not in fields:
            raise ValueError(f"{kind}: bad option {item.strip()!r} in {text!r}: write name=value with a name "
                             f"from {', '.join(sorted(fields))}")
        default = fields[name].default
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{kind}: option {name} takes true or false, got {value!r}")
            out[name] = value.lower() in ("true", "1")
        elif isinstance(default, int):
            out[name] = int(value)
        elif isinstance(default, float):
            out[name] = float(value)
        else:
            out[name] = value
    return out


class PuzzleGame:
    """The text-game protocol (`reset(game_id)`, `step(action)`, `close()`) around a puzzle's rules.

    A subclass sets `kind`, `task` and `admissible`, and implements `_start(split, index)` (set up the
    generated puzzle), `_render()` (the state as text), `_play(action)` (a `GameObs` made with
    `_reply`) and `expert_move()` (the expert's next answer from the current state, None when the
    puzzle cannot be solved from here). An answer that is not a legal move returns `valid=False` and
    leaves the game unchanged."""

    kind: ClassVar[str] = ""
    cfg: Any
    """The game's config dataclass (with `train_games` and `heldout_games`)."""
    admissible: tuple[str, ...] = ()
    """What the game lists as admissible (the grid games: the four moves; Sudoku lists nothing, since
    its legal placements would give the puzzle away)."""

    def __init__(self) -> None:
        self.game_id = ""
        self.task = ""
        self.done = False
        self.won = False
        self.moves = 0
        self._extra: tuple[tuple[str, str | float], ...] = ()

    # ---- for subclasses ---------------------------------------------------------------------------
    def _start(self, split: str, index: int) -> None:
        raise NotImplementedError

    def _render(self) -> str:
        raise NotImplementedError

    def _play(self, action: str) -> GameObs:
        raise NotImplementedError

    def expert_move(self) -> str | None:
        """The expert's answer in the current state (None: no solution from here)."""
        raise NotImplementedError

    def _info(self) -> tuple[tuple[str, str | float], ...]:
        return (("task", self.task), ("game_id", self.game_id), *self._extra)

    def _reply(self, text: str, *, valid: bool = True, won: bool = False, done: bool = False) -> GameObs:
        if valid:
            self.moves += 1
            self.won, self.done = won, done or won
        return GameObs(observation=text, admissible=self.admissible, reward=1.0 if won else 0.0, won=won,
                       done=self.done if valid else False, valid=valid, info=self._info())

    # ---- the protocol -----------------------------------------------------------------------------
    def reset(self, game_id: str) -> GameObs:
        split, index = parse_game_id(game_id)
        self._start(split, index)
        self.game_id = game_id
        self.done = self.won = False
        self.moves = 0
        return GameObs(observation=self._render(), admissible=self.admissible, info=self._info())

    def step(self, action: str) -> GameObs:
        if not self.game_id:
            raise ValueError("step before reset: call reset(game_id) first")
        if self.done:
            raise ValueError(f"{self.kind} game {self.game_id} is over; reset to play again")
        return self._play(action)

    def close(self) -> None:
        return None

    def list_games(self, split: str) -> list[str]:
        """The game ids listed for `split` (the config's `train_games` / `heldout_games`)."""
        return list_split(split, self.cfg.train_games, self.cfg.heldout_games)
