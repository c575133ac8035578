"""The text-game image and the sandboxed game server (real Docker engine), and the text-game
evaluation path: the expert through it wins everything, a tiny random model wins nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from swerl.cli import main
from swerl.envs.alfworld import NOTHING_HAPPENS, list_games, task_type_of, walkthrough
from swerl.envs.alfworld.env import eval_options, expert_plans
from swerl.envs.textgame.client import GameServerDied, SandboxTextGame, TextGameError
from swerl.envs.textgame.expert import ExpertEngine
from swerl.envs.textgame.image import build_textgame_image
from swerl.envs.textgame.protocol import make_game
from swerl.envs.textgame.tasks import GameTaskSet
from swerl.eval.episodes import evaluate_async, sample_path
from swerl.sandbox import DockerSandbox, SandboxSpec

WEIRD = 'examine "x"\n\u00e9t\u00e9 \u4e2d\u6587 \U0001F600 \\ \' $(true) `id`'


@pytest.fixture(scope="session")
def textgame_image(docker_client, base_image):
    return build_textgame_image(client=docker_client)


@pytest.fixture(scope="module")
def one_per_type() -> list[str]:
    ids = list_games(split="heldout")
    return [next(g for g in ids if task_type_of(g) == t) for t in sorted({task_type_of(g) for g in ids})]


def _script(game_id: str) -> list[str]:
    # invalid actions (quotes, newline, unicode, shell syntax), a valid detour, then the expert plan
    return [WEIRD, "look", "inventory", "take the moon", *walkthrough(None, game_id)]


def _play(game, game_id: str) -> list:
    return [game.reset(game_id), *(game.step(a) for a in _script(game_id))]


@pytest.mark.docker
def test_image_is_cached_by_content(docker_client, textgame_image):
    assert textgame_image.startswith("swerl-textgames:")
    assert build_textgame_image(client=docker_client) == textgame_image  # unchanged recipe: one lookup
    labels = docker_client.images.get(textgame_image).attrs["Config"]["Labels"]
    assert labels["swerl.user"] == "swerl" and "alfworld" in labels["swerl.textgames"]


@pytest.mark.docker
def test_container_and_in_process_give_identical_transcripts(textgame_image, one_per_type):
    game_id = next(g for g in one_per_type if "pick_two" in g)
    local = make_game("alfworld")
    try:
        expected = _play(local, game_id)
    finally:
        local.close()
    with DockerSandbox(SandboxSpec(image=textgame_image)) as sb, SandboxTextGame(sb, "alfworld") as game:
        got = _play(game, game_id)
        assert got == expected
        assert got[1].valid is False and got[1].observation == NOTHING_HAPPENS
        assert got[-1].won and got[-1].done
        with pytest.raises(TextGameError, match="is over"):
            game.step("look")
        with pytest.raises(TextGameError, match="no ALFWorld game 'nope'"):
            game.reset("nope")
        assert game.reset(game_id) == expected[0]  # the server survives refused requests


@pytest.mark.docker
def test_dead_server_gives_a_clear_error(textgame_image, one_per_type):
    with DockerSandbox(SandboxSpec(image=textgame_image)) as sb:
        game = SandboxTextGame(sb, "alfworld")
        game.reset(one_per_type[0])
        pid = sb.run("pgrep -f swerl.envs.textgame.server").output.split()[0]
        sb.run(f"kill -9 {pid}")
        with pytest.raises(GameServerDied,
                           match=r"alfworld game server in sandbox \w+ exited .*start a fresh sandbox"):
            game.step("look")
        with pytest.raises(GameServerDied, match="earlier"):
            game.step("look")
        game.close()
        with pytest.raises(GameServerDied, match="could not start: cannot start game 'alfworld'"):
            SandboxTextGame(sb, "alfworld", data_dir="/no/such/dir")


@pytest.mark.docker
def test_expert_through_the_eval_path_in_sandboxes_wins_everything(textgame_image, one_per_type, tmp_path):
    from swerl.agent import load_tokenizer

    tok = load_tokenizer()
    engine = ExpertEngine(tok, expert_plans(one_per_type))
    games = GameTaskSet.of("alfworld", one_per_type, eval_options(), image=textgame_image)
    rep = asyncio.run(evaluate_async(games, tmp_path, engine=engine, tokenizer=tok, model_name="expert",
                                     workers=2, progress=False))
    assert rep["samples_ran"] == 6 and rep["sample_errors"] == 0
    assert rep["success_rate"] == 1.0 and rep["mean_score"] == 1.0
    assert sorted(rep["by_group"]) == sorted({task_type_of(g) for g in one_per_type})
    assert all(g["success_rate"] == 1.0 and g["episodes"] == 1 for g in rep["by_group"].values())
    assert rep["mean_episode_reward"] == 10.0 and rep["invalid_action_rate"] == 0.0
    assert json.loads((tmp_path / "report.json").read_text()) == rep
    sample = json.loads(sample_path(tmp_path, one_per_type[0], 0).read_text())
    assert (sample["won"] and sample["steps"] == len(walkthrough(None, one_per_type[0]))
            and sample["stop_reason"] == "won")


@pytest.mark.slow
def test_cli_expert_in_process_and_tiny_model(tmp_path, one_per_type):
    """`swerl eval --game alfworld`: the expert (in process) wins; a tiny random-init model wins nothing,
    and a second run resumes from the samples already written."""
    out = tmp_path / "expert"
    assert main(["eval", "--game", "alfworld", "--expert", "--in-process", "--limit", "2", "--out", str(out),
                 "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["success_rate"] == 1.0 and rep["episodes"] == 2

    from swerl.models import make_tiny_qwen

    model = make_tiny_qwen(tmp_path / "tiny")
    out = tmp_path / "tiny-eval"
    args = ["eval", "--game", "alfworld", "--model", str(model), "--in-process", "--filter", "*pick_heat*",
            "--limit", "1", "--max-steps", "2", "--max-new-tokens", "16", "--seed", "0", "--out", str(out),
            "--quiet"]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["episodes"] == 1 and rep["success_rate"] == 0.0 and rep["sample_errors"] == 0
    (gid,) = [g for g in list_games(split="heldout") if "pick_heat" in g][:1]
    path = sample_path(out, gid, 0)
    first = path.read_text()
    assert main(args) == 0 and path.read_text() == first  # resumed: the sample was not run again
