"""ActFocus's puzzle games (Sokoban, FrozenLake, Sudoku) on the text-game protocol.

Every game is generated from a seed, so there is no data folder: a game id `train-00017` names the 17th
game of the train split, and the split is decided by a hash of the generated puzzle itself, so the
train and held-out sets never share a puzzle (`swerl.envs.games.common`). The game modules
(`sokoban`, `frozenlake`, `sudoku`) import only the standard library, `swerl.structs`, this package's
`common` and their own libraries (FrozenLake: gymnasium), because they also run inside the text-game
image; the agent side (prompts, the `<answer>` format, expert plans, evaluation options) is
`swerl.envs.games.env`, imported on its own.
"""
