"""Environments: SWE tasks (`swerl.envs.swe`), the text-game harness (`swerl.envs.textgame`) and the games
on it (`swerl.envs.alfworld`, `swerl.envs.webshop`, the puzzles of `swerl.envs.games`), and the toy token
game (`swerl.envs.toy`); every kind is listed in `swerl.envs.registry`, and `swerl.envs.checker` checks
an env against the `Env` contract. Never imports torch; this file imports nothing, because it is copied
into the text-game image."""
