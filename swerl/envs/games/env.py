"""The puzzle games (Sokoban, FrozenLake, Sudoku) as agent environments: their prompts, the `<answer>`
format, expert plans and the options `swerl eval --game` and the training task sets need.

    game = make_game("sokoban")                     # or SandboxTextGame(sb, "sokoban"); kwargs: SokobanConfig
    env = PuzzleEnv(game, "heldout-00003", SOKOBAN_PROMPT, PUZZLES["sokoban"].config)
    traj = await run_episode(env, engine, tokenizer, limits=env.config.episode_limits())

The model's turn is RAGEN's: `<think>…</think><answer>ACTION</answer>`, with `answer` the only action
tag (`ANSWER_FORMAT`). ACTION is `Up` / `Down` / `Left` / `Right` in Sokoban and FrozenLake and
`ROW COL VALUE` in Sudoku (see each game's module). A turn without a well-formed `<answer>` block is
answered by the episode loop with how to write one and uses up a turn; an answer that is not a legal
move costs `invalid_penalty` and changes nothing; solving the puzzle pays `win_reward` (and ends the
episode, reason `won`); FrozenLake's hole and Sudoku's dead end end it lost. The step budget is
`TextGameConfig.max_steps` turns.

Generator options travel as the game's keyword arguments, written `name=value,...` where a data
folder would go (`GameTaskConfig.data`, `swerl eval --game-data`), e.g. `dim=7,boxes=2`;
empty: the defaults.

Host side only (it imports the agent harness); the games themselves are the modules beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swerl.agent.format import ActionFormat
from swerl.envs.games.common import HELDOUT_SPLIT, PuzzleGame, parse_options
from swerl.envs.games.frozenlake import FrozenLakeConfig, FrozenLakeGame
from swerl.envs.games.sokoban import SokobanConfig, SokobanGame
from swerl.envs.games.sudoku import SudokuConfig, SudokuGame
from swerl.envs.textgame.env import TextGameConfig, TextGameEnv, TextGamePrompt
from swerl.envs.textgame.expert import ExpertPlans
from swerl.envs.textgame.tasks import GameOptions

ANSWER_FORMAT = ActionFormat(kind="tag", action_tags=("answer",))
"""`<think>…</think>` then exactly one `<answer>…</answer>` block, nothing after it."""
ANSWER_TAG = "answer"
OPENING = "Initial state:\n"
"""What precedes the first observation in every puzzle's first message (the expert plans' keys)."""

_STEP = "{history}{observation}\n\nTurns used: {step} of {max_steps}."
_INVALID = "{history}{observation}\n\n(Invalid answer: penalty {penalty}.) Turns used: {step} of {max_steps}."
_HISTORY = "[{step}] {action} -> {observation}"


def _first(answer: str) -> str:
    """The first user message: the task, the board, the budget and how to answer (`answer` names it)."""
    return ("{task}\n\n" + OPENING
            + "{observation}\n\nYou have {max_steps} turns. Think inside <think> </think>, "
            f"then answer {answer} inside <answer> </answer>.")

SOKOBAN_PROMPT = TextGamePrompt(
    system=("You are solving a Sokoban puzzle. The room is drawn one row per line: # wall, _ floor, O "
            "target, X box, √ box on a target, P you, S you standing on a target. A move takes you one cell "
            "Up, Down, Left or Right; walking into a box pushes it one cell when the cell beyond it is free. "
            "Boxes cannot be pulled, so a box pushed into a corner stays there. Each turn, think step by "
            "step inside <think> </think>, then give exactly one move inside <answer> </answer>, for example "
            "<answer>Left</answer>."),
    first=_first("with one of {actions}"),
    step=_STEP, invalid=_INVALID, history_line=_HISTORY,
)

FROZENLAKE_PROMPT = TextGamePrompt(
    system=("You are crossing a frozen lake, drawn one row per line: _ frozen ice, O hole, G goal, P you, X "
            "you in a hole, √ you on the goal. A move takes you one cell Up, Down, Left or Right; a move off "
            "the edge leaves you where you are. Reach the goal without stepping into a hole. Each turn, "
            "think step by step inside <think> </think>, then give exactly one move inside <answer> "
            "</answer>, for example <answer>Down</answer>."),
    first=_first("with one of {actions}"),
    step=_STEP, invalid=_INVALID, history_line=_HISTORY,
)

SUDOKU_PROMPT = TextGamePrompt(
    system=("You are solving a Sudoku puzzle. The grid shows column numbers on top and row numbers on the "
            "left; . marks an empty cell, | and - separate the boxes. Each turn you fill one empty cell: "
            "think step by step inside <think> </think>, then answer ROW COL VALUE inside <answer> "
            "</answer>, for example <answer>2 3 4</answer> puts 4 in row 2, column 3. A value may not repeat "
            "in its row, column or box, and placed values cannot be changed."),
    first=_first("ROW COL VALUE"),
    step=_STEP, invalid=_INVALID, history_line=_HISTORY,
)


@dataclass(frozen=True)
class PuzzleSpec:
    """What the agent side knows about one puzzle kind."""

    kind: str
    """The kind, as registered in `swerl.envs.registry` (and the game server's GAME_KINDS)."""
    game: type[PuzzleGame]
    """The game class (constructed from the options)."""
    options: type
    """The game's config dataclass (its keyword arguments)."""
    prompt: TextGamePrompt
    """The wording of the episode."""
    config: TextGameConfig
    """Default rewards and step budget (`swerl eval --game`; training sets max_steps from
    rollout.max_turns)."""

    def __post_init__(self) -> None:
        if self.game.kind != self.kind:
            raise ValueError(f"PuzzleSpec {self.kind!r} names the game class of {self.game.kind!r}")


PUZZLES: dict[str, PuzzleSpec] = {
    "sokoban": PuzzleSpec("sokoban", SokobanGame, SokobanConfig, SOKOBAN_PROMPT,
                          TextGameConfig(max_steps=20)),
    "frozenlake": PuzzleSpec("frozenlake", FrozenLakeGame, FrozenLakeConfig, FROZENLAKE_PROMPT,
                             TextGameConfig(max_steps=20)),
    "sudoku": PuzzleSpec("sudoku", SudokuGame, SudokuConfig, SUDOKU_PROMPT, TextGameConfig(max_steps=20)),
}
"""The puzzle kinds. Win 10, invalid answer -0.1 (as ALFWorld); 20 turns (the default Sokoban rooms are
solved within 20 moves, a 4x4 lake in at most 15, a 4x4 Sudoku with 6 clues has 10 empty cells)."""


@dataclass
class PuzzleEnv(TextGameEnv):
    """`TextGameEnv` whose turns must end in `<answer>…</answer>` (see the module docstring)."""

    action_format: ActionFormat = field(default=ANSWER_FORMAT)


def spec(kind: str) -> PuzzleSpec:
    """The spec of a puzzle kind."""
    if kind not in PUZZLES:
        raise ValueError(f"no puzzle game {kind!r}; the puzzle games are {', '.join(PUZZLES)}")
    return PUZZLES[kind]


def game_kwargs(kind: str, data: str | None = None) -> dict[str, Any]:
    """The game's keyword arguments from an options text (`dim=7,boxes=2`; empty: the defaults),
    checked by building its config."""
    s = spec(kind)
    kwargs = parse_options(data, s.options, kind)
    s.options(**kwargs)
    return kwargs


def make_puzzle(kind: str, data: str | None = None) -> PuzzleGame:
    """The game of `kind` in this process, with the options of `data`."""
    return spec(kind).game(**game_kwargs(kind, data))


def list_games(kind: str, data: str | None = None, split: str = HELDOUT_SPLIT) -> list[str]:
    """The game ids listed for one split (`train` or `heldout`)."""
    return make_puzzle(kind, data).list_games(split)


def _make_env(game: Any, game_id: str, prompt: TextGamePrompt, config: TextGameConfig) -> PuzzleEnv:
    return PuzzleEnv(game, game_id, prompt, config)


def eval_options(kind: str, data: str | None = None) -> GameOptions:
    """How to play a puzzle kind (game kwargs, prompt, default rewards and budget, the env class, one
    report group named by the options)."""
    s, kwargs = spec(kind), game_kwargs(kind, data)
    label = data.strip() if data and data.strip() else "default"
    return GameOptions(game_kwargs=kwargs, prompt=s.prompt, config=s.config, make_env=_make_env,
                       group_of=lambda gid: label)


def expert_actions(game: PuzzleGame, game_id: str, max_steps: int = 1000) -> list[str]:
    """The expert's answers on `game_id`, found by playing it in this process with the game's own expert
    (`expert_move`, from each state reached); the games are deterministic (FrozenLake's slips are seeded
    by the game id), so the same answers replay the same episode anywhere. The episode may be lost
    (a slippery lake); it raises when the expert gets stuck or runs past `max_steps`."""
    obs = game.reset(game_id)
    actions: list[str] = []
    while not obs.done:
        move = game.expert_move()
        if move is None:
            raise RuntimeError(f"{game.kind} {game_id}: the expert finds no solution from the state reached")
        if len(actions) >= max_steps:
            raise RuntimeError(f"{game.kind} {game_id}: the expert did not finish within {max_steps} moves")
        actions.append(move)
        obs = game.step(move)
    return actions


def expert_plans(kind: str, game_ids: list[str], data: str | None = None) -> ExpertPlans:
    """Each game's expert answers keyed by its first observation as the prompt shows it (for
    `ExpertEngine`, which plays them in `<answer>` tags). Two games with the same puzzle share a key;
    they must then share a plan too (only a slippery FrozenLake can break that: it raises)."""
    game = make_puzzle(kind, data)
    plans = ExpertPlans(tag=ANSWER_TAG)
    try:
        for gid in game_ids:
            key = OPENING + game.reset(gid).observation
            plan = expert_actions(game, gid)
            if key in plans and plans[key] != plan:
                raise ValueError(f"{kind}: two games open with the same puzzle but the expert plays them "
                                 f"apart ({gid}); evaluate the expert on a lake that does not slip")
            plans[key] = plan
        return plans
    finally:
        game.close()


__all__ = [
    "ANSWER_FORMAT",
    "FROZENLAKE_PROMPT",
    "HELDOUT_SPLIT",
    "OPENING",
    "PUZZLES",
    "SOKOBAN_PROMPT",
    "SUDOKU_PROMPT",
    "PuzzleEnv",
    "PuzzleSpec",
    "eval_options",
    "expert_actions",
    "expert_plans",
    "game_kwargs",
    "list_games",
    "make_puzzle",
]
