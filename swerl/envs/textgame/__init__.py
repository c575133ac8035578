"""The shared text-game harness (ALFWorld, WebShop, the puzzle games of `swerl.envs.games`): one game
protocol, run in-process or in a sandbox, and the agent environment on top of it. One module per job:

* `protocol`: the `TextGame` protocol, the game classes by kind (`GAME_KINDS`), `make_game` and the
  wire form of an observation;
* `server`: the line-protocol server that runs a game inside the text-game image;
* `client`: `SandboxTextGame`, the host side of that protocol, and `open_game`;
* `image`: the image's wheel pins, sources and data, and its content-hashed build;
* `env`: `TextGameEnv`, the agent `Env` of a game (prompt, rewards, budgets);
* `expert`: `ExpertEngine`, a scripted policy that plays expert plans, and `scripted_turn`;
* `tasks`: text games as training tasks (`GameTaskSet`) and the per-kind glue (`GameOptions`, `GameListing`).

This package is copied into the text-game image (`image.TEXTGAME_SOURCES`) where only the standard
library, `swerl.structs` and the games are installed, so this file imports nothing and `protocol` and
`server` import only the standard library and `swerl.structs`.

For a new game (what the WebShop helper needs, and nothing more):

1. Write the game class: constructed from JSON-serialisable keyword arguments (e.g. a data
   directory), implementing `TextGame` (`reset(game_id) -> GameObs`, `step(action) -> GameObs`,
   `close()`). An action that is not admissible returns `GameObs(valid=False, ...)` and leaves the
   game unchanged. Put the task text in `GameObs.info` as `("task", "...")`: `TextGameEnv` shows it
   in the prompt. The module must import only the standard library, `swerl.structs` and the game's
   own libraries, because it also runs inside the text-game image.
2. Register its class in `protocol.GAME_KINDS`: `"webshop": "swerl.envs.webshop:WebShopGame"`, and the
   kind in `swerl.envs.registry` (an `EnvKind` with a `GameListing`) and as a section of
   `swerl.train_config.EnvConfig`.
3. For the sandbox image: append its pinned wheels to `image.TEXTGAME_REQUIREMENTS`, its source files
   to `image.TEXTGAME_SOURCES` and its data directory to `image.TEXTGAME_DATA_DIRS`.
4. Give `TextGameEnv` a `TextGamePrompt` with the game's wording.

Running a game:

    game = make_game("alfworld")                       # in this process
    with DockerSandbox(SandboxSpec(image=build_textgame_image())) as sb, \\
            SandboxTextGame(sb, "alfworld") as game:   # inside a container, over the line protocol
        obs = game.reset(game_id)
        obs = game.step(obs.admissible[0])

    env = TextGameEnv(game, game_id, prompt=MY_PROMPT, config=TextGameConfig())
    traj = await run_episode(env, engine, tokenizer, limits=env.config.episode_limits())

Rewards (`TextGameConfig`): each invalid action costs `invalid_penalty`, a win pays `win_reward`,
and every `StepResult.reward` is the running episode total (the episode keeps the last one).
`max_steps` is enforced by the episode loop as `EpisodeLimits.max_turns` (a truncation, reason
`max_turns`), never by ending the episode as terminated: use `config.episode_limits()`.
"""
