"""The text-game protocol: what a game is (`TextGame`), which class plays each kind (`GAME_KINDS`), and an
observation's wire form (`obs_to_dict` / `obs_from_dict`) for the line protocol of `server` and `client`.

Runs inside the text-game image too (the server imports it), so it imports only the standard library
and `swerl.structs`.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Protocol, runtime_checkable

from swerl.structs import GameObs


@runtime_checkable
class TextGame(Protocol):
    """A text game, in this process or behind the line protocol in a sandbox."""

    def reset(self, game_id: str) -> GameObs:
        """Start the game `game_id` from its initial state."""
        ...

    def step(self, action: str) -> GameObs:
        """Play one action; an inadmissible one returns `valid=False` and changes nothing."""
        ...

    def close(self) -> None:
        """Release the game's resources. Idempotent."""
        ...


GAME_KINDS: dict[str, str] = {
    "alfworld": "swerl.envs.alfworld:AlfWorldGame",
    "webshop": "swerl.envs.webshop:WebShopGame",
    "sokoban": "swerl.envs.games.sokoban:SokobanGame",
    "frozenlake": "swerl.envs.games.frozenlake:FrozenLakeGame",
    "sudoku": "swerl.envs.games.sudoku:SudokuGame",
}
"""The game class of each text-game kind, "module:Class". A class is constructed from JSON-serialisable
keyword arguments and implements `reset(game_id) -> GameObs`, `step(action) -> GameObs`, `close()`.
The kinds themselves are `swerl.envs.registry`'s; this table is the half of a kind the image can
import (only the standard library, `swerl.structs` and the games are installed there), kept in step
with the registry by a test."""


def game_class(kind: str) -> type:
    """The game class registered for `kind` (imported on first use)."""
    if kind not in GAME_KINDS:
        raise ValueError(f"unknown text-game kind {kind!r}; known kinds: {', '.join(sorted(GAME_KINDS))}")
    module, _, name = GAME_KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def obs_to_dict(obs: GameObs) -> dict[str, Any]:
    """A GameObs as JSON-ready data (tuples become lists)."""
    return {"observation": obs.observation, "admissible": list(obs.admissible), "reward": obs.reward,
            "won": obs.won, "done": obs.done, "valid": obs.valid, "info": [list(p) for p in obs.info]}


def obs_from_dict(d: dict[str, Any]) -> GameObs:
    """The inverse of `obs_to_dict`; float-valued info entries keep their type through JSON."""
    return GameObs(observation=d["observation"], admissible=tuple(d["admissible"]), reward=float(d["reward"]),
                   won=bool(d["won"]), done=bool(d["done"]), valid=bool(d["valid"]),
                   info=tuple((str(k), v) for k, v in d["info"]))


def make_game(kind: str, **kwargs: Any) -> TextGame:
    """The in-process game of `kind`, constructed exactly as the sandboxed server constructs it."""
    json.dumps(kwargs)  # the same arguments must be able to travel to a sandboxed server
    return game_class(kind)(**kwargs)
