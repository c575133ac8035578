"""The env registry (`swerl.envs.registry`) is the one list of env kinds: training's config, the CLI's
choices and the text-game server follow it, and an unknown kind's error lists the kinds."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from swerl.envs.registry import ENV_KINDS, EnvKind, env_kind, game_kind, game_kind_names, kind_names
from swerl.envs.textgame.tasks import GameOptions
from swerl.structs import Trajectory

KINDS = ("toy", "swe", "alfworld", "webshop", "sokoban", "frozenlake", "sudoku")


def _traj(reward: float | None, stop_reason: str = "") -> Trajectory:
    return Trajectory(token_ids=(0, 1), loss_mask=(0, 1), span=(0, 2), logprobs=(0.0, 0.0),
                      turn_index=(-1, 0), prompt_len=1, terminated=True, truncated=False,
                      stop_reason=stop_reason, reward=reward, num_turns=1, num_tool_calls=0)


def test_every_kind_is_listed_once_and_well_formed():
    assert kind_names() == KINDS
    assert game_kind_names() == ("alfworld", "webshop", "sokoban", "frozenlake", "sudoku")
    for k in ENV_KINDS:
        assert isinstance(k, EnvKind) and env_kind(k.name) is k
        assert dataclasses.is_dataclass(k.config) and k.config.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert (k.task_set is None) != (k.engine_game is None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            k.name = "other"  # type: ignore[misc]
    assert env_kind("toy").engine_game is not None and env_kind("toy").heldout_split == ""
    assert [k.name for k in ENV_KINDS if k.games is not None and not k.games.pays_win_reward] == ["webshop"]


def test_unknown_kinds_are_refused_with_the_kinds_listed():
    with pytest.raises(ValueError, match=r"env\.kind must be one of") as e:
        env_kind("nope")
    assert all(k in str(e.value) for k in KINDS)
    with pytest.raises(ValueError, match="no text game 'swe'") as e:
        game_kind("swe")
    assert all(k in str(e.value) for k in game_kind_names())


def test_train_config_has_one_section_per_kind_of_the_registry_type():
    from swerl.config import ConfigError, load
    from swerl.train_config import EnvConfig, TrainConfig

    hints = typing.get_type_hints(EnvConfig)
    sections = {f.name for f in dataclasses.fields(EnvConfig)} - {"kind"}
    assert sections == set(KINDS)
    for k in ENV_KINDS:
        assert hints[k.name] is k.config
        cfg = EnvConfig(kind=k.name)
        assert cfg.spec is k and isinstance(cfg.section, k.config)
    with pytest.raises(ValueError, match=r"env\.kind must be one of") as e:
        EnvConfig(kind="nope")
    assert all(k in str(e.value) for k in KINDS)
    with pytest.raises((ConfigError, ValueError), match="sokoban"):
        load(TrainConfig, None, ["env.kind=nope"])


def test_cli_game_choices_and_the_game_server_follow_the_registry():
    from swerl.cli import build_parser
    from swerl.envs.textgame.protocol import GAME_KINDS

    assert set(GAME_KINDS) == set(game_kind_names())
    ev = build_parser()._subparsers._group_actions[0].choices["eval"]  # type: ignore[union-attr]
    game = ev._subparsers._group_actions[0].choices["game"]  # type: ignore[union-attr]
    kind = next(a for a in game._actions if a.dest == "game")
    assert tuple(kind.choices) == game_kind_names()
    for argv in (["eval", "game", "toy", "--expert"], ["eval", "--game", "toy", "--expert"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)


def test_success_rules():
    assert env_kind("toy").success(_traj(1.0)) and not env_kind("toy").success(_traj(0.0))
    assert env_kind("swe").success(_traj(1.0)) and not env_kind("swe").success(_traj(0.5))
    for name in game_kind_names():
        assert env_kind(name).success(_traj(10.0, "won")) and not env_kind(name).success(_traj(10.0, "lost"))


@pytest.mark.parametrize("name", ["sokoban", "frozenlake", "sudoku", "webshop", "alfworld"])
def test_game_listing_gives_typed_options_and_a_task_set(name):
    from swerl.envs.textgame.tasks import GameTaskConfig

    kind, games = game_kind(name)
    ids = games.list_games(None, kind.heldout_split)
    assert ids
    opts = games.options(None, 2.5)
    assert isinstance(opts, GameOptions) and isinstance(opts.group_of(ids[0]), str)
    assert kind.task_set is not None
    tasks = kind.task_set(GameTaskConfig(sandbox=False, limit=2, win_reward=3.0, invalid_penalty=0.5),
                          max_steps=7)
    assert len(tasks.ids) == 2
    assert tasks.config.max_steps == 7 and tasks.config.invalid_penalty == 0.5  # type: ignore[attr-defined]
    assert tasks.config.win_reward == (3.0 if games.pays_win_reward else opts.config.win_reward)  # type: ignore[attr-defined]
    spec = tasks.specs(tasks.ids[0], group=0, n=2)
    assert len(spec) == 2 and spec[0].sandbox is None


def test_envs_do_not_import_the_training_side():
    import subprocess
    import sys

    code = ("import sys, swerl.envs.registry; bad = [m for m in sys.modules if m.startswith(('swerl.train', "
            "'swerl.cli', 'swerl.rollout', 'swerl.learner', 'torch'))]; print(bad); sys.exit(1 if bad else "
            "0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
