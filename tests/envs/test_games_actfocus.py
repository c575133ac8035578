"""ActFocus's puzzle games (swerl/envs/games): seeded generators and disjoint splits, the solvers as
experts, gymnasium's FrozenLake agreeing with the expert's model of it, the rules of invalid answers,
the `<answer>` format, and whole episodes through the real episode loop, the evaluation path and the
training task set, in this process (and, with Docker, in the text-game image)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import random
import tomllib
from pathlib import Path

import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS

from swerl.agent import ScriptedEngine, load_tokenizer, parse_turn, run_episode
from swerl.envs.games import frozenlake as fl
from swerl.envs.games import sokoban as sk
from swerl.envs.games import sudoku as sd
from swerl.envs.games.common import (
    HELDOUT_SPLIT,
    derive_seed,
    format_game_id,
    parse_game_id,
    parse_move,
    split_of,
)
from swerl.envs.games.env import (
    ANSWER_FORMAT,
    OPENING,
    PUZZLES,
    PuzzleEnv,
    eval_options,
    expert_actions,
    expert_plans,
    game_kwargs,
    list_games,
    make_puzzle,
)
from swerl.envs.textgame.expert import ExpertEngine, scripted_turn
from swerl.envs.textgame.image import TEXTGAME_REQUIREMENTS, TEXTGAME_SOURCES
from swerl.envs.textgame.protocol import GAME_KINDS, make_game

ROOT = Path(__file__).resolve().parents[2]
PUZZLE_KINDS = ("sokoban", "frozenlake", "sudoku")
MAP_4X4 = tuple(MAPS["4x4"])
"""gymnasium's fixed 4x4 map (FrozenLake-v1 without `desc`)."""


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _content(game, game_id: str) -> str:
    return game.reset(game_id).observation


# ---- registration ------------------------------------------------------------------------------------


def test_registered_where_the_other_games_are():
    from swerl.cli import build_parser
    from swerl.envs.registry import game_kind_names

    for kind in PUZZLE_KINDS:
        assert GAME_KINDS[kind].startswith(f"swerl.envs.games.{kind}:")
        assert kind in game_kind_names() and kind in PUZZLES
        assert type(make_game(kind)).kind == kind
        assert build_parser().parse_args(["eval", "game", kind, "--expert"]).game == kind
        assert build_parser().parse_args(["eval", "--game", kind, "--expert"]).game == kind  # the old form
    assert "swerl/envs/games" in TEXTGAME_SOURCES
    # FrozenLake's gymnasium: the same pin in the package and in the text-game image
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "gymnasium==1.4.0" in deps and "gymnasium==1.4.0" in TEXTGAME_REQUIREMENTS


def test_game_ids_options_and_config_errors():
    assert format_game_id("train", 17) == "train-00017" and parse_game_id("heldout-3") == ("heldout", 3)
    with pytest.raises(ValueError, match="bad puzzle game id 'test-1'"):
        parse_game_id("test-1")
    assert game_kwargs("sokoban", "dim=7, boxes=2") == {"dim": 7, "boxes": 2}
    assert game_kwargs("frozenlake", "slippery=true,p=0.7") == {"slippery": True, "p": 0.7}
    assert game_kwargs("sudoku", "") == {} and game_kwargs("sudoku", None) == {}
    with pytest.raises(ValueError, match="sokoban: bad option 'colour=red'"):
        game_kwargs("sokoban", "colour=red")
    with pytest.raises(ValueError, match="sudoku: size must be one of 4, 6, 8, 9"):
        game_kwargs("sudoku", "size=5")
    with pytest.raises(ValueError, match="sokoban: unknown option"):
        make_game("sokoban", rooms=3)
    with pytest.raises(ValueError, match="no puzzle game 'chess'"):
        list_games("chess")
    assert list_games("sudoku", "heldout_games=3") == ["heldout-00000", "heldout-00001", "heldout-00002"]
    assert len(list_games("sokoban", None, "train")) == 10_000
    game = make_game("sudoku")
    with pytest.raises(ValueError, match="step before reset"):
        game.step("1 1 1")


# ---- generators and splits ---------------------------------------------------------------------------


def test_generators_are_deterministic_per_seed():
    assert sk.generate_room(7) == sk.generate_room(7) and sk.generate_room(7) != sk.generate_room(8)
    assert sd.generate_puzzle(7) == sd.generate_puzzle(7) and sd.generate_puzzle(7) != sd.generate_puzzle(8)
    assert fl.generate_map(7) == fl.generate_map(7)
    assert len({fl.generate_map(s) for s in range(10)}) > 1
    # seeds come from sha256 (not hash()), so a game id names the same puzzle in every process and machine
    assert derive_seed("sokoban", "", "train", 0, 0) == int.from_bytes(
        hashlib.sha256(b"sokoban::train:0:0").digest()[:8], "big") >> 1
    pinned = {"sokoban": "######\n#___P#\n#X####\n#_####\n#O####\n######",
              "frozenlake": "P__O\n____\n____\n_OOG",
              "sudoku": "    1 2   3 4\n 1  . . | 3 1\n 2  . 1 | . .\n    ----+----\n 3  4 . | . .\n 4  1 . "
                        "| 2 ."}
    for kind, text in pinned.items():  # a changed generator renames every game: change these on purpose only
        assert make_game(kind).reset("train-00000").observation == text
    for kind in PUZZLE_KINDS:  # a fresh game (a fresh process has the same seeds) builds the same puzzle
        a, b = make_game(kind), make_game(kind)
        for gid in ("train-00000", "heldout-00004"):
            assert a.reset(gid) == b.reset(gid)


@pytest.mark.parametrize("kind", PUZZLE_KINDS)
def test_splits_are_disjoint_puzzle_sets(kind):
    game = make_game(kind)
    n = 40
    train = {_content(game, format_game_id("train", i)) for i in range(n)}
    held = {_content(game, format_game_id("heldout", i)) for i in range(n)}
    assert not train & held
    assert all(split_of(kind, c) == "train" for c in train) and all(split_of(kind,
                                                                             c) == "heldout" for c in held)
    assert len(train) > n // 4 and len(held) > n // 4  # varied (4x4 lakes repeat: 2^14 hole patterns at most)


# ---- Sokoban -----------------------------------------------------------------------------------------


def _parse_room(text: str) -> sk.Room:
    """A room from its rendering (the inverse of `sk.render` at the starting positions)."""
    lines = text.strip("\n").split("\n")
    if any(len(line) != len(lines) for line in lines):
        raise ValueError("a Sokoban room must be square")
    walls, targets, boxes, players = set(), set(), set(), []
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            if ch not in (sk.WALL, sk.FLOOR, sk.TARGET, sk.BOX, sk.BOX_ON_TARGET, sk.PLAYER,
                          sk.PLAYER_ON_TARGET):
                raise ValueError(f"unknown Sokoban symbol {ch!r} at row {r}, column {c}")
            if ch == sk.WALL:
                walls.add((r, c))
            if ch in (sk.TARGET, sk.BOX_ON_TARGET, sk.PLAYER_ON_TARGET):
                targets.add((r, c))
            if ch in (sk.BOX, sk.BOX_ON_TARGET):
                boxes.add((r, c))
            if ch in (sk.PLAYER, sk.PLAYER_ON_TARGET):
                players.append((r, c))
    if len(players) != 1:
        raise ValueError(f"a Sokoban room needs exactly one player, found {len(players)}")
    return sk.Room(len(lines), frozenset(walls), frozenset(targets), frozenset(boxes), players[0])


def test_sokoban_rules_and_solver_on_a_drawn_room():
    text = "######\n#P___#\n#_X__#\n#__XO#\n#___O#\n######"
    room = _parse_room(text)
    assert sk.render(room, room.player, room.boxes) == text
    assert room.targets == {(3, 4), (4, 4)} and room.boxes == {(2, 2), (3, 3)}
    # a wall blocks; a push moves box and player; a box cannot push another box
    assert sk.push(room, (1, 1), room.boxes, "Up") == ((1, 1), room.boxes, "blocked")
    pushed = sk.push(room, (2, 1), room.boxes, "Right")
    assert pushed == ((2, 2), frozenset({(2, 3), (3, 3)}), "pushed")
    assert sk.push(room, (1, 3), pushed[1], "Down")[2] == "blocked"
    plan = sk.solve(room)
    assert plan is not None
    p, b = room.player, room.boxes
    for m in plan:
        p, b, _ = sk.push(room, p, b, m)
    assert b == room.targets
    stuck = _parse_room("#####\n#X_P#\n#__O#\n#___#\n#####")  # the box sits in a corner that is no target
    assert sk.solve(stuck) is None
    with pytest.raises(ValueError, match="exactly one player"):
        _parse_room("####\n#XO#\n#__#\n####")


def test_every_generated_room_is_solvable_and_the_expert_plan_wins():
    game = make_game("sokoban")
    cfg = sk.SokobanConfig()
    for gid in [format_game_id(s, i) for s in ("train", "heldout") for i in range(25)]:
        split, index = parse_game_id(gid)
        room, plan = sk.game_room(cfg, split, index)
        assert sk.solve(room) == list(plan) and cfg.min_moves <= len(plan) <= cfg.max_moves
        obs = game.reset(gid)
        assert obs.info_dict()["optimal_moves"] == len(plan) and obs.admissible == ("Up", "Down", "Left",
                                                                                    "Right")
        for i, m in enumerate(plan):
            obs = game.step(m)
            assert obs.valid and obs.done == (i == len(plan) - 1)
        assert obs.won and obs.reward == 1.0 and "solved!" in obs.observation
        assert expert_actions(game, gid) == list(plan)
    # the expert replans from a state off its plan
    game.reset("train-00003")
    assert game.room is not None
    first = game.expert_move()
    other = next(m for m in ("Up", "Down", "Left", "Right") if m != first
                 and sk.solve(game.room, *sk.push(game.room, game.player, game.boxes, m)[:2]) is not None)
    game.step(other)
    while not game.done:
        move = game.expert_move()
        assert move is not None
        game.step(move)
    assert game.won


def test_sokoban_invalid_answers_change_nothing():
    game = make_game("sokoban")
    start = game.reset("heldout-00001")
    for bad in ("jump", "", "Up Left", "north"):
        obs = game.step(bad)
        assert not obs.valid and not obs.done and obs.observation.endswith(start.observation)
        assert ("is not a move: answer with exactly one of Up, Down, Left, Right. Nothing "
                "happened.") in obs.observation
    assert game.moves == 0 and game.reset("heldout-00001") == start


# ---- FrozenLake --------------------------------------------------------------------------------------


def _maps() -> list[tuple[str, ...]]:
    cfg = fl.FrozenLakeConfig()
    return [MAP_4X4, *(fl.game_map(cfg, s, i) for s in ("train", "heldout") for i in range(6)),
            fl.generate_map(3, size=6)]


def test_gymnasium_agrees_with_the_experts_transition_model():
    for desc in _maps():
        env = fl.make_gym_env(desc)
        env.reset(seed=0)
        n = len(desc)
        for r in range(n):
            for c in range(n):
                if desc[r][c] in "HG":
                    continue
                for move in ("Up", "Down", "Left", "Right"):
                    env.unwrapped.s = r * n + c
                    state, reward, terminated, _, _ = env.step(fl.GYM_ACTIONS[move])
                    nxt = fl.lake_move(desc, (r, c), move)
                    assert divmod(int(state), n) == nxt, (desc, (r, c), move)
                    assert (terminated == (desc[nxt[0]][nxt[1]] in "HG")
                            and reward == (desc[nxt[0]][nxt[1]] == "G"))
        env.close()


def test_frozenlake_expert_reaches_the_goal():
    assert fl.shortest_path(MAP_4X4) is not None and len(fl.shortest_path(MAP_4X4)) == 6
    assert fl.shortest_path(("SH", "HG")) is None
    game = make_game("frozenlake")
    for gid in [format_game_id(s, i) for s in ("train", "heldout") for i in range(15)]:
        obs = game.reset(gid)
        plan = fl.shortest_path(game.desc)
        assert plan is not None and obs.info_dict()["optimal_moves"] == len(plan)
        assert expert_actions(game, gid) == plan and game.won
    # the game's outcomes follow the expert's model of the map: a hole ends it lost, the goal wins
    rng = random.Random(0)
    for _ in range(30):
        game.reset(format_game_id("train", rng.randrange(50)))
        desc, pos = game.desc, (0, 0)
        while not game.done and game.moves < 99:  # gymnasium's step limit ends the game at 100
            move = rng.choice(("Up", "Down", "Left", "Right"))
            obs = game.step(move)
            pos = fl.lake_move(desc, pos, move)
            assert game.pos == pos and obs.valid
            tile = desc[pos[0]][pos[1]]
            assert obs.done == (tile in "HG") and obs.won == (tile == "G")
            if tile == "H":
                assert "You fell into a hole. Game over." in obs.observation and "X" in obs.observation


def test_frozenlake_render_and_invalid_answers():
    game = make_game("frozenlake")
    obs = game.reset("heldout-00000")
    assert obs.observation.split("\n")[0][0] == "P" and obs.observation.split("\n")[-1][-1] == "G"
    bad = game.step("Jump!")
    assert not bad.valid and bad.observation.endswith(obs.observation) and "is not a move" in bad.observation
    edge = game.step("up")  # off the top edge: a legal move that changes nothing
    assert edge.valid and "changes nothing" in edge.observation and game.pos == (0, 0)


def test_slippery_lake_is_seeded_by_the_game_id():
    def play(game, gid):
        game.reset(gid)
        out = []
        for _ in range(12):
            if game.done:
                break
            out.append(game.step("Right").observation)
        return out

    a, b = make_game("frozenlake", slippery=True), make_game("frozenlake", slippery=True)
    runs = [play(a, format_game_id("train", i)) for i in range(8)]
    assert runs == [play(b, format_game_id("train", i)) for i in range(8)]
    assert any("slippery" in o for r in runs for o in r)  # slips do happen
    assert "slippery" in a.reset("train-00000").info_dict()["task"]


# ---- Sudoku ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 6])
def test_sudoku_puzzles_have_one_solution_and_the_expert_solves_them(size):
    kwargs = {"size": size, "clues": 6 if size == 4 else 16}
    cfg = sd.SudokuConfig(**kwargs)
    game = make_game("sudoku", **kwargs)
    for gid in [format_game_id(s, i) for s in ("train", "heldout") for i in range(10 if size == 4 else 3)]:
        split, index = parse_game_id(gid)
        puzzle = sd.game_puzzle(cfg, split, index)
        assert sd.count_solutions(puzzle.givens, size, 5) == 1
        assert sd.solve(puzzle.givens, size) == puzzle.solution
        assert sum(1 for v in puzzle.givens if v) >= cfg.clues
        sol = puzzle.solution
        assert all(sorted(sol[r * size:(r + 1) * size]) == list(range(1, size + 1)) for r in range(size))
        assert all(sorted(sol[c::size]) == list(range(1, size + 1)) for c in range(size))
        actions = expert_actions(game, gid)
        assert game.won and len(actions) == puzzle.givens.count(0) and game.grid == puzzle.solution


def test_sudoku_render():
    grid = (1, 0, 0, 4, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0, 1)
    assert sd.render(grid, 4) == ("    1 2   3 4\n 1  1 . | . 4\n 2  . . | 2 .\n    ----+----\n 3  . 3 | . "
                                  ".\n 4  4 . | . 1")
    assert sd.render(tuple(range(1, 7)) * 6, 6).split("\n")[0] == "    1 2 3   4 5 6"


def _clash(grid: tuple[int, ...], where: str) -> tuple[int, int, int] | None:
    """(row, col, value) from 1 of an empty cell and a value found only in its `where` (row/column/box)."""
    for i, v in enumerate(grid):
        if v:
            continue
        r, c = divmod(i, 4)
        sets = {"row": {grid[r * 4 + k] for k in range(4)}, "column": {grid[k * 4 + c] for k in range(4)},
                "box": {grid[(r - r % 2 + a) * 4 + c - c % 2 + b] for a in range(2) for b in range(2)}}
        others = set().union(*(s for k, s in sets.items() if k != where))
        for value in sorted(sets[where] - others - {0}):
            return r + 1, c + 1, value
    return None


def test_sudoku_invalid_placements_get_the_documented_reply():
    game = make_game("sudoku")
    start = game.reset("heldout-00000")
    puzzle = game.puzzle
    assert puzzle is not None
    given = next(i for i, v in enumerate(puzzle.givens) if v)
    gr, gc = divmod(given, 4)
    cases = {
        "up": "'up' is not a placement: answer ROW COL VALUE, three numbers from 1 to 4",
        "1 2": "'1 2' is not a placement",
        "1 2 3 4": "'1 2 3 4' is not a placement",
        "": "'' is not a placement",
        "5 1 1": "There is no row 5: rows, columns and values run from 1 to 4.",
        "1 1 0": "There is no value 0",
        f"{gr + 1} {gc + 1} {puzzle.givens[given]}": (f"Row {gr + 1}, column {gc + 1} already holds "
                                                       f"{puzzle.givens[given]} (given); placed values "
                                                       "cannot"),
    }
    for where in ("row", "column", "box"):
        found = _clash(puzzle.givens, where)
        if found:
            r, c, v = found
            cases[f"{r},{c},{v}"] = (f"{v} cannot go in row {r}, column {c}: its {where} already has a {v} "
                                     "(row ")
    assert len(cases) >= 9  # at least two of the three kinds of clash
    for answer, message in cases.items():
        obs = game.step(answer)
        assert not obs.valid and not obs.done, answer
        assert message in obs.observation and "Nothing changed." in obs.observation, (answer, obs.observation)
        assert obs.observation.endswith(start.observation) and game.grid == puzzle.givens
    # a legal placement, then the same cell again: filled by an earlier placement
    move = game.expert_move()
    assert move is not None and game.step(move).valid
    again = game.step(move)
    assert not again.valid and "(placed earlier)" in again.observation
    assert sd.parse_placement("2, 3, 4") == (2, 3, 4) and sd.parse_placement(" 2 3 4. ") == (2, 3, 4)


def test_sudoku_dead_end_ends_the_game_lost():
    game = make_game("sudoku")
    game.reset("train-00000")
    # row 1: 1 2 . .; cell (1,3) can only take 3 (column 3 has a 4): putting 3 at (1,4) leaves it nothing
    game.grid = (1, 2, 0, 0, 3, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0)
    obs = game.step("1 4 3")
    assert obs.valid and obs.done and not obs.won
    assert ("Row 1, column 3 can no longer take any value, so the grid cannot be finished. Game "
            "over.") in obs.observation
    relaxed = make_game("sudoku", end_when_stuck=False)
    relaxed.reset("train-00000")
    relaxed.grid = (1, 2, 0, 0, 3, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0)
    assert not relaxed.step("1 4 3").done and relaxed.expert_move() is None


# ---- the <answer> format -----------------------------------------------------------------------------


def test_answer_format_parsing():
    ok = parse_turn("<think>\nthe box is left of me\n</think>\n\n<answer> Left </answer>", ANSWER_FORMAT)
    assert not ok.malformed and json.loads(ok.tool_calls[0].arguments_json) == {"content": "Left"}
    assert ok.reasoning == "the box is left of me"
    for text, why in [("Left", "contained no action"),
                      ("<think>go left</think>", "contained no action"),
                      ("<think>x</think><answer>Left", "is never closed"),
                      ("<action>Left</action>", "contained no action"),  # only <answer> counts here
                      ("<think>x", "never closed"),
                      ("<answer>Left</answer> then Up", "text after the action"),
                      ("<answer>Left</answer><answer>Up</answer>", "contained 2 actions"),
                      ("<think><answer>Left</answer></think>", "contained no action")]:
        turn = parse_turn(text, ANSWER_FORMAT)
        assert turn.malformed and why in (turn.error or ""), (text, turn.error)
        assert "<answer>…</answer>" in (turn.error or "")
    assert [parse_move(a) for a in (" up ", "LEFT", "Right.", "down")] == ["Up", "Left", "Right", "Down"]
    assert [parse_move(a) for a in ("Upward", "", "U", "left right")] == [None] * 4


# ---- whole episodes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PUZZLE_KINDS)
def test_expert_episode_through_the_episode_loop_wins(tok, kind):
    gid = "heldout-00002"
    plans = expert_plans(kind, [gid])
    assert plans.tag == "answer" and len(plans) == 1
    game = make_game(kind)
    env = PuzzleEnv(game, gid, PUZZLES[kind].prompt, PUZZLES[kind].config)
    engine = ExpertEngine(tok, plans)
    traj = asyncio.run(run_episode(env, engine, tok, limits=env.config.episode_limits()))
    assert traj.terminated and traj.stop_reason == "won" and env.won and traj.reward == 10.0
    assert traj.num_malformed == 0 and not traj.drift_detected and env.invalid_actions == 0
    assert traj.num_turns == len(next(iter(plans.values())))
    first = tok.decode(traj.token_ids[:traj.prompt_len])
    assert OPENING + game.reset(gid).observation in first and "<answer>" in first


def test_malformed_and_invalid_turns_cost_what_is_documented(tok):
    gid = "train-00001"
    game = make_game("sokoban")
    plan = expert_actions(game, gid)
    turns = ["Left", scripted_turn("Left", "I go left"), scripted_turn("fly", tag="answer"),
             *(scripted_turn(a, "push", tag="answer") for a in plan)]
    config = dataclasses.replace(PUZZLES["sokoban"].config, max_steps=len(turns))
    env = PuzzleEnv(game, gid, PUZZLES["sokoban"].prompt, config)
    engine = ScriptedEngine(tok, turns)
    traj = asyncio.run(run_episode(env, engine, tok, limits=env.config.episode_limits()))
    # two malformed turns (no tags; <action> instead of <answer>) use turns but no penalty; one invalid answer
    assert traj.num_malformed == 2 and env.invalid_actions == 1 and env.won
    assert traj.reward == pytest.approx(10.0 - 0.1) and traj.stop_reason == "won"
    assert "End your message with exactly one <answer>…</answer> block" in traj.turns[0].observation
    assert "'fly' is not a move" in traj.turns[2].observation and "(Invalid answer: penalty -0.1.)" in \
        traj.turns[2].observation


def test_eval_path_and_training_task_set_in_process(tok, tmp_path):
    from swerl.envs.registry import env_kind
    from swerl.envs.textgame.tasks import GameTaskConfig, GameTaskSet
    from swerl.eval.episodes import evaluate_async

    for kind in PUZZLE_KINDS:
        ids = list_games(kind, None, HELDOUT_SPLIT)[:2]
        games = GameTaskSet.of(kind, ids, eval_options(kind), image=None)
        rep = asyncio.run(evaluate_async(games, tmp_path / kind,
                                         engine=ExpertEngine(tok, expert_plans(kind, ids)), tokenizer=tok,
                                         model_name="expert", progress=False))
        assert rep["success_rate"] == 1.0 and rep["sample_errors"] == 0 and rep["episodes"] == 2
        ek = env_kind(kind)
        assert ek.task_set is not None
        tasks = ek.task_set(GameTaskConfig(sandbox=False, limit=3, win_reward=5.0), max_steps=20)
        assert tasks.ids == ("train-00000", "train-00001", "train-00002") and tasks.image is None
        spec = tasks.specs(tasks.ids[1], group=0, n=1)[0]
        env = spec.make_env(None)
        traj = asyncio.run(run_episode(env, ExpertEngine(tok, expert_plans(kind, [tasks.ids[1]])), tok,
                                       limits=env.config.episode_limits()))
        assert traj.reward == 5.0 and ek.success(traj)


def test_injected_latency_is_lognormal_seeded_by_the_task_stream_and_slept_by_the_runner(tok):
    """`latency_median_s`: each episode's `latency_s` comes from a lognormal seeded by the task id and
    how many of its groups came before (the same task stream, the same draws); 0 draws nothing. The
    runner sleeps it after the episode."""
    import statistics
    import time

    from swerl.envs.registry import env_kind
    from swerl.envs.textgame.tasks import GameTaskConfig
    from swerl.rollout import run_episodes

    make = env_kind("frozenlake").task_set
    assert make is not None
    assert all(s.latency_s == 0.0 for s in make(GameTaskConfig(sandbox=False, limit=2), max_steps=3)
               .specs("train-00000", group=0, n=4))

    def draws(order: list[str]) -> list[list[float]]:
        tasks = make(GameTaskConfig(sandbox=False, limit=2, latency_median_s=0.5, latency_sigma=1.0),
                     max_steps=3)
        return [[s.latency_s for s in tasks.specs(tid, group=g, n=200)] for g, tid in enumerate(order)]

    a, b = draws(["train-00000", "train-00001", "train-00000"]), draws(["train-00000", "train-00001"])
    assert a[:2] == b  # same stream, same draws
    assert a[0] != a[2] and a[0] != a[1]  # a task's next group, another task: fresh draws
    assert all(x > 0 for x in a[0]) and statistics.median(a[0]) == pytest.approx(0.5, rel=0.25)
    assert statistics.stdev(math.log(x) for x in a[0]) == pytest.approx(1.0, rel=0.2)

    tasks = make(GameTaskConfig(sandbox=False, limit=1, latency_median_s=0.3, latency_sigma=0.0),
                 max_steps=20)
    specs = tasks.specs("train-00000", group=0, n=2)
    assert [s.latency_s for s in specs] == pytest.approx([0.3, 0.3])  # σ 0: exactly the median
    t0 = time.monotonic()
    got = asyncio.run(run_episodes(specs, ExpertEngine(tok, expert_plans("frozenlake", ["train-00000"])),
                                   tok, limits=tasks.config.episode_limits(), progress=False))
    assert all(r.trajectory is not None for r in got), [r.error for r in got]
    assert 0.3 <= time.monotonic() - t0 < 0.3 + 5  # slept once per episode, side by side


@pytest.mark.parametrize("field", ["latency_median_s", "latency_sigma"])
@pytest.mark.parametrize("value", [-0.5, math.nan])
def test_latency_settings_must_be_non_negative(field, value):
    from swerl.envs.textgame.tasks import GameTaskConfig

    with pytest.raises(ValueError, match=r"latency_median_s and latency_sigma must be >= 0"):
        GameTaskConfig(**{field: value})


@pytest.mark.docker
@pytest.mark.slow
def test_sandboxed_games_play_like_in_process(docker_client, base_image):
    from swerl.envs.textgame.client import SandboxTextGame
    from swerl.envs.textgame.image import build_textgame_image
    from swerl.sandbox import DockerSandbox, SandboxSpec

    image = build_textgame_image(client=docker_client)
    with DockerSandbox(SandboxSpec(image=image)) as sb:
        for kind in PUZZLE_KINDS:
            local = make_puzzle(kind)
            script = ["nonsense", *expert_actions(local, "heldout-00001")]
            with SandboxTextGame(sb, kind) as remote:
                assert remote.reset("heldout-00001") == local.reset("heldout-00001")
                for a in script:
                    assert remote.step(a) == local.step(a)
                assert local.won


@pytest.mark.parametrize("kind", ["sokoban", "frozenlake", "sudoku"])
def test_swerl_train_runs_a_step_on_each_puzzle_game_in_process(tmp_path, kind):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "swerl.cli", "train", "--config", "configs/alfworld_cpu.yaml",
                        f"run_dir={tmp_path / kind}", f"env.kind={kind}", f"env.{kind}.sandbox=false",
                        f"env.{kind}.limit=4", "steps=1", "eval_every=1", "eval.limit=2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(ln) for ln in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()
            if ln.strip()]
    assert rows[-1]["actor/episodes"] > 0 and "val/success_rate" in rows[-1]
