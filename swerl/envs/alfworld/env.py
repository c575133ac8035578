"""ALFWorld as an agent environment: its prompt wording and the glue between the game, the text-game
harness and evaluation (host side; the game itself is `swerl.envs.alfworld.game`).

    game = make_game("alfworld")                              # or SandboxTextGame(sb, "alfworld")
    env = TextGameEnv(game, game_id, prompt=ALFWORLD_PROMPT, config=TextGameConfig())

The prompt follows verl-agent's structure for ALFWorld (the task, the current observation, the
admissible actions, then `<think>…</think><action>…</action>`), in swerl's own words. ALFWorld's `help`
command is accepted but not listed, as verl-agent does.
"""

from __future__ import annotations

from typing import Any

from swerl.envs.alfworld.game import SHIPPED_DATA, list_games, resolve_data_dir, task_type_of, walkthrough
from swerl.envs.textgame.env import TextGameConfig, TextGameEnv, TextGamePrompt
from swerl.envs.textgame.tasks import GameOptions

HELDOUT_SPLIT = "heldout"
"""The shipped set's held-out split (rooms unseen in train); the default of evaluations."""

ALFWORLD_PROMPT = TextGamePrompt(
    system=("You are a household robot in a text world. Each turn, think briefly inside <think> </think> "
            "about what to do next, then write exactly one command inside <action> </action>, copied from "
            "the list of admissible actions."),
    first=("Your task is to {task}\n\nWhat you see:\n{observation}\n\nStep {step} of at most {max_steps}. "
           "Admissible actions: {actions}\n\nThink inside <think> </think>, then answer with one admissible "
           "action inside <action> </action>."),
    step="{history}{observation}\n\nStep {step} of at most {max_steps}. Admissible actions: {actions}",
    invalid=("{history}\"{action}\" is not admissible here; nothing happens (penalty {penalty}). Step {step} "
             "of at most {max_steps}. Copy one of the admissible actions exactly: {actions}"),
    hidden_actions=("help",),
)


def expert_plans(game_ids: list[str], data_dir: str | None = None) -> dict[str, list[str]]:
    """Each game's expert plan keyed by its opening observation (for `ExpertEngine`): the observation
    is read by playing the game's reset in this process."""
    from swerl.envs.alfworld.game import AlfWorldGame

    game = AlfWorldGame(data_dir)
    try:
        plans: dict[str, list[str]] = {}
        for gid in game_ids:
            key = game.reset(gid).observation
            if key in plans and plans[key] != walkthrough(data_dir, gid):
                raise ValueError(f"two games open with the same observation but differ: {gid}")
            plans[key] = walkthrough(data_dir, gid)
        return plans
    finally:
        game.close()


def eval_options(data_dir: str | None = None) -> GameOptions:
    """How to play ALFWorld (game kwargs, prompt, default rewards and budget, the env class, grouping by
    task type). A data folder inside the checkout is passed relative to it, so it names the same games in
    the image."""
    kwargs: dict[str, Any] = {}
    if data_dir:
        p = resolve_data_dir(data_dir).resolve()
        root = SHIPPED_DATA.parents[1].resolve()
        kwargs["data_dir"] = str(p.relative_to(root)) if root in p.parents else str(p)
    return GameOptions(game_kwargs=kwargs, prompt=ALFWORLD_PROMPT, config=TextGameConfig(),
                       make_env=TextGameEnv, group_of=task_type_of)


__all__ = ["ALFWORLD_PROMPT", "HELDOUT_SPLIT", "eval_options", "expert_plans", "list_games", "task_type_of"]
