"""ALFWorld on TextWorld's PDDL engine: the household text game, as the `alfworld` package plays it.

A game is a directory holding ALFWorld's two files:

- `game.tw-pddl`: JSON with `pddl_domain` (the ALFRED domain shipped in the alfworld wheel),
  `grammar` (its text grammar, with the task sentence filled in), `pddl_problem`, `solvable` and
  `walkthrough` (an expert plan);
- `traj_data.json`: the task (`task_type`, `pddl_params`, ...).

The same loader reads the official data (`$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}`,
made by `alfworld-download` + `alfworld-generate`) and the generated set shipped in `tasks/alfworld`
(`swerl tasks alfworld`, see `swerl.envs.alfworld.generator`). A game id is the game directory's path
relative to the data directory, e.g.
`heldout/pick_heat_then_place_in_recep-Potato-None-Fridge-room31/trial_00007`.

The game is loaded as ALFWorld loads it (`PddlEnv` + `AlfredDemangler` + `AlfredInfos`), so
observations are ALFWorld's words ("-= Welcome to TextWorld, ALFRED! =-", "You arrive at cabinet 1.
The cabinet 1 is closed.", "Nothing happens."). Actions are matched against the admissible commands
after collapsing whitespace and lower-casing (every ALFWorld command is lower-case); any other text
is not played: the reply is ALFWorld's "Nothing happens." with `valid=False`.

This module runs inside the text-game image too: it imports only the standard library,
`swerl.structs` and the game libraries.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from swerl.structs import GameObs

TASK_TYPES: dict[int, str] = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
"""ALFWorld's six task types, by its own numbering."""

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
SPLITS_FILE = "splits.json"
NOTHING_HAPPENS = "Nothing happens."
SHIPPED_DATA = Path(__file__).resolve().parents[3] / "tasks" / "alfworld"
"""The generated set shipped with swerl (the same relative place inside the text-game image)."""
_TASK_RE = re.compile(r"Your task is to: (.*)")


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    """None: the shipped set; a relative path is taken from the swerl checkout's root, so the same
    argument names the same data on the host and inside the text-game image."""
    if data_dir is None:
        return SHIPPED_DATA
    p = Path(data_dir).expanduser()
    return p if p.is_absolute() else SHIPPED_DATA.parents[1] / p


def task_type_of(game_id: str) -> str:
    """The task type named by a game id (ALFWorld's directories start with it)."""
    for part in reversed(Path(game_id).parts):
        for t in TASK_TYPES.values():
            if part.startswith(t + "-") or part == t:
                return t
    return "unknown"


def _playable(game_dir: Path) -> bool:
    """ALFWorld's own filter: a game file that was checked solvable; no movable or sliced tasks."""
    s = str(game_dir)
    if "movable" in s or "Sliced" in s:
        return False
    try:
        data = json.loads((game_dir / GAME_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(data.get("solvable"))


def list_games(data_dir: str | os.PathLike[str] | None = None, split: str | None = None,
               task_types: tuple[str, ...] | None = None) -> list[str]:
    """Game ids under `data_dir`, sorted: from its `splits.json` manifest when there is one (the
    generated set), else every playable game directory found under `data_dir/split` (the official
    layout: train, valid_seen, valid_unseen). `task_types` keeps only those types."""
    root = resolve_data_dir(data_dir)
    manifest = root / SPLITS_FILE
    if manifest.is_file():
        splits = json.loads(manifest.read_text())
        if split is None:
            ids = sorted(g for v in splits.values() for g in v)
        elif split not in splits:
            raise ValueError(f"{manifest} has no split {split!r}; it has {', '.join(sorted(splits))}")
        else:
            ids = sorted(splits[split])
    else:
        base = root / split if split else root
        if not base.is_dir():
            raise ValueError(f"no ALFWorld games at {base}: expected a folder of game directories "
                             f"(each with {GAME_FILE} and {TRAJ_FILE})")
        ids = sorted(str(Path(d).relative_to(root)) for d, _, names in os.walk(base)
                     if GAME_FILE in names and TRAJ_FILE in names and _playable(Path(d)))
    if task_types:
        ids = [g for g in ids if task_type_of(g) in task_types]
    return ids


def load_game_file(data_dir: str | os.PathLike[str] | None, game_id: str) -> dict[str, Any]:
    """The JSON of a game's `game.tw-pddl` (domain, grammar, problem, solvable, walkthrough)."""
    return json.loads((_game_dir(resolve_data_dir(data_dir), game_id) / GAME_FILE).read_text())


def walkthrough(data_dir: str | os.PathLike[str] | None, game_id: str) -> list[str]:
    """The expert plan stored with a game (the planner's, kept by the generator)."""
    plan = load_game_file(data_dir, game_id).get("walkthrough")
    if not plan:
        raise ValueError(f"game {game_id} has no walkthrough")
    return list(plan)


def _game_dir(root: Path, game_id: str) -> Path:
    d = (root / game_id).resolve()
    if root.resolve() not in d.parents:
        raise ValueError(f"game id {game_id!r} points outside the data directory {root}")
    if not (d / GAME_FILE).is_file():
        raise ValueError(f"no ALFWorld game {game_id!r} in {root} (no {GAME_FILE} there)")
    return d


def _norm(command: str) -> str:
    return " ".join(command.split()).lower()


class AlfWorldGame:
    """One ALFWorld game at a time on TextWorld's PDDL engine; implements `TextGame`.

    `data_dir`: the games' root (default: the shipped set `tasks/alfworld`; a relative path is taken
    from the swerl checkout; for ALFWorld's own files pass `$ALFWORLD_DATA/json_2.1.1`)."""

    def __init__(self, data_dir: str | None = None) -> None:
        self.data_dir = resolve_data_dir(data_dir)
        if not self.data_dir.is_dir():
            raise ValueError(f"ALFWorld data directory {self.data_dir} does not exist (generate one with "
                             "`swerl tasks alfworld --out DIR`, or pass ALFWorld's json_2.1.1 folder)")
        self._env: Any = None
        self._obs: GameObs | None = None
        self._game_id = ""
        self._loaded = ""
        self._info: tuple[tuple[str, str | float], ...] = ()

    def _engine(self) -> Any:
        if self._env is None:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
            from textworld.envs import PddlEnv

            infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
            self._env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        return self._env

    def reset(self, game_id: str) -> GameObs:
        game_dir = _game_dir(self.data_dir, game_id)
        env = self._engine()
        if game_id != self._loaded:  # loading translates the PDDL (about a second): once per game
            self._loaded = ""
            env.load(str(game_dir / GAME_FILE))
            self._loaded = game_id
        state = env.reset()
        task_type = task_type_of(game_id)
        traj = game_dir / TRAJ_FILE
        if traj.is_file():
            task_type = json.loads(traj.read_text()).get("task_type", task_type)
        m = _TASK_RE.search(state.feedback)
        self._game_id = game_id
        self._info = (("task", m.group(1).strip() if m else ""), ("task_type", task_type),
                      ("game_id", game_id))
        self._obs = self._to_obs(state)
        return self._obs

    def _to_obs(self, state: Any) -> GameObs:
        won = bool(state["won"])
        return GameObs(observation=state.feedback, admissible=tuple(state["admissible_commands"]),
                       reward=1.0 if won else 0.0, won=won, done=won, valid=True, info=self._info)

    def step(self, action: str) -> GameObs:
        if self._obs is None:
            raise ValueError("step before reset: call reset(game_id) first")
        if self._obs.done:
            raise ValueError(f"game {self._game_id} is over (won); reset to play again")
        wanted = _norm(action)
        command = next((c for c in self._obs.admissible if _norm(c) == wanted), None)
        if command is None:
            # not played at all, so the game state (and its admissible list) stays exactly as it was
            return GameObs(observation=NOTHING_HAPPENS, admissible=self._obs.admissible, valid=False,
                           info=self._info)
        state, _, _ = self._env.step(command)
        self._obs = self._to_obs(state)
        return self._obs

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._loaded = ""
