"""ALFWorld (Shridhar et al., 2021) on TextWorld's PDDL engine: the household text game as the
`alfworld` package plays it (`game`), a generator of games for its six task types (`generator`,
`swerl tasks alfworld`) and the agent-side glue: prompt, expert plans, evaluation options (`env`,
imported on its own). `AlfWorldGame` implements the text-game protocol, so it runs in-process or inside
a sandbox through the shared text-game harness. This file and `game` import only the standard library,
`swerl.structs` and the game libraries, because the package is copied into the text-game image.
Never imports torch."""

from swerl.envs.alfworld.game import (
    GAME_FILE,
    NOTHING_HAPPENS,
    SHIPPED_DATA,
    SPLITS_FILE,
    TASK_TYPES,
    TRAJ_FILE,
    AlfWorldGame,
    list_games,
    load_game_file,
    resolve_data_dir,
    task_type_of,
    walkthrough,
)

__all__ = [
    "GAME_FILE", "NOTHING_HAPPENS", "SHIPPED_DATA", "SPLITS_FILE", "TASK_TYPES", "TRAJ_FILE", "AlfWorldGame",
    "list_games", "load_game_file", "resolve_data_dir", "task_type_of", "walkthrough",
]
