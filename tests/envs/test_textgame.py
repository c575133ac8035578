"""The text-game harness in this process: the line protocol server (a real subprocess), the agent env
(rewards, invalid actions, budgets) and a full episode through `run_episode`, on real ALFWorld games."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from swerl.agent import TAG_FORMAT, ScriptedEngine, load_tokenizer, parse_turn, run_episode
from swerl.envs.alfworld import NOTHING_HAPPENS, list_games, walkthrough
from swerl.envs.alfworld.env import ALFWORLD_PROMPT
from swerl.envs.textgame.env import TextGameConfig, TextGameEnv, TextGamePrompt
from swerl.envs.textgame.expert import scripted_turn
from swerl.envs.textgame.protocol import GAME_KINDS, make_game, obs_from_dict, obs_to_dict
from swerl.structs import GameObs, ParsedTurn, Span

WEIRD = 'go to "cabinet 1"\n\u00e9t\u00e9 \u4e2d\u6587 \U0001F600 \\ \' $(true)'


@pytest.fixture(scope="module")
def heat_game_id() -> str:
    return next(g for g in list_games(split="heldout") if "pick_heat" in g)


@pytest.fixture(scope="module")
def game():
    g = make_game("alfworld")
    yield g
    g.close()


def _turn(action: str) -> ParsedTurn:
    turn = parse_turn(scripted_turn(action), TAG_FORMAT)
    assert not turn.malformed
    return turn


def test_registry_and_obs_round_trip():
    assert GAME_KINDS["alfworld"] == "swerl.envs.alfworld:AlfWorldGame"
    obs = GameObs(observation="a\nb \u00e9", admissible=("x", "y"), reward=0.5, won=False, done=True,
                  valid=False, info=(("task", "t"), ("score", 0.25)))
    assert obs_from_dict(json.loads(json.dumps(obs_to_dict(obs)))) == obs
    with pytest.raises(ValueError, match="unknown text-game kind 'chess'"):
        make_game("chess")
    with pytest.raises(TypeError, match="not JSON serializable"):
        make_game("alfworld", data_dir=object())


def test_server_protocol_over_a_pipe(heat_game_id):
    """The server as a real process: ready line, replies per request, errors answered without dying,
    actions with quotes / newlines / unicode arrive intact, close ends it with status 0."""
    proc = subprocess.Popen([sys.executable, "-m", "swerl.envs.textgame.server", "alfworld", "{}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8")
    assert proc.stdin and proc.stdout

    def ask(req: dict | str) -> dict:
        proc.stdin.write((req if isinstance(req, str) else json.dumps(req)) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        assert json.loads(proc.stdout.readline()) == {"ok": True, "ready": "alfworld"}
        err = ask({"op": "step", "action": "look"})
        assert err["ok"] is False and "step before reset" in err["error"]
        assert ask("not json")["ok"] is False
        assert "unknown op 'fly'" in ask({"op": "fly"})["error"]
        bad = ask({"op": "reset", "game_id": "no/such/game"})
        assert bad["ok"] is False and "no ALFWorld game 'no/such/game'" in bad["error"]
        first = obs_from_dict(ask({"op": "reset", "game_id": heat_game_id})["obs"])
        assert first.observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
        weird = obs_from_dict(ask({"op": "step", "action": WEIRD})["obs"])
        assert (weird.valid, weird.observation, weird.admissible) == (False, NOTHING_HAPPENS,
                                                                      first.admissible)
        plan = walkthrough(None, heat_game_id)
        last = None
        for a in plan:
            last = obs_from_dict(ask({"op": "step", "action": a})["obs"])
            assert last.valid
        assert last is not None and last.won and last.done and last.reward == 1.0
        assert ask({"op": "close"}) == {"ok": True}
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_server_reports_a_game_that_cannot_start():
    out = subprocess.run([sys.executable, "-m", "swerl.envs.textgame.server", "alfworld",
                          json.dumps({"data_dir": "/no/such/dir"})], capture_output=True, text=True, input="")
    assert out.returncode == 2
    reply = json.loads(out.stdout.splitlines()[0])
    assert reply["ok"] is False and "/no/such/dir does not exist" in reply["error"]


def test_image_sources_alone_run_the_server(tmp_path):
    """The image holds only TEXTGAME_SOURCES (and the game data): from a copy of just those files the
    server module and every game class must import, as the image build's own check does. A module they
    import that is not listed would fail here instead of in the image build."""
    import shutil

    from swerl.envs.textgame.image import REPO_ROOT, TEXTGAME_SOURCES

    for rel in TEXTGAME_SOURCES:
        src, dst = REPO_ROOT / rel, tmp_path / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    code = ("import sys, swerl, swerl.envs.textgame.server\n"
            "from swerl.envs.textgame.protocol import GAME_KINDS, game_class\n"
            "assert swerl.__file__.startswith(sys.argv[1]), swerl.__file__\n"
            "[game_class(k) for k in GAME_KINDS]\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stderr


def test_env_rewards_invalid_actions_and_win(game, heat_game_id):
    """Two inadmissible actions (penalised, game unchanged), then the expert plan: the running total
    is reported every step and the win pays win_reward: 10 - 2 * 0.1 = 9.8."""
    env = TextGameEnv(game, heat_game_id, prompt=ALFWORLD_PROMPT, config=TextGameConfig())
    start = env.reset()
    system, user = start.messages
    assert system.role == "system" and "<action>" in system.content
    task = env.last.info_dict()["task"]
    assert task.startswith(("put a hot", "heat some")) and f"Your task is to {task}" in user.content
    # help: accepted, not listed
    assert "'go to countertop 1'" in user.content and "'help'" not in user.content
    assert "Step 0 of at most 50" in user.content
    before = env.last
    r1 = env.step(_turn("fly to the moon"))
    assert r1.error and not r1.terminated and r1.reward == pytest.approx(-0.1)
    assert '"fly to the moon" is not admissible here' in r1.observation and "(penalty -0.1)" in r1.observation
    assert "'go to countertop 1'" in r1.observation
    r2 = env.step(_turn(WEIRD))
    assert r2.reward == pytest.approx(-0.2) and WEIRD in r2.observation
    assert env.last.admissible == before.admissible and env.invalid_actions == 2
    plan = walkthrough(None, heat_game_id)
    for a in plan[:-1]:
        # matched without regard to case, as every ALFWorld command is lower-case
        r = env.step(_turn(a.upper()))
        assert not r.error and not r.terminated and r.reward == pytest.approx(-0.2)
    r = env.step(_turn(plan[-1]))
    assert r.terminated and r.reason == "won" and r.reward == pytest.approx(9.8)
    assert env.won and env.steps == len(plan) + 2
    with pytest.raises(ValueError, match="is over"):
        env.step(_turn("look"))


def test_env_history_and_config_checks(game, heat_game_id):
    cfg = TextGameConfig(history_steps=1, list_actions=False, max_steps=3)
    prompt = TextGamePrompt(system="s", first="{task}|{observation}|{actions}|{step}|{max_steps}",
                            step="{history}OBS {observation} ACTS {actions} {step}/{max_steps}",
                            invalid="{history}BAD {action} {penalty} {actions}")
    env = TextGameEnv(game, heat_game_id, prompt=prompt, config=cfg)
    env.reset()
    plan = walkthrough(None, heat_game_id)
    r = env.step(_turn(plan[0]))
    assert (r.observation.startswith("OBS You arrive at")
            and r.observation.endswith("ACTS (as listed before) 1/3"))
    r = env.step(_turn("nope"))  # the history: the steps before this one (here the last one, history_steps=1)
    assert r.observation.startswith(f"Recent steps:\n[1] {plan[0]} -> You arrive at")
    assert r.observation.endswith("BAD nope -0.1 (as listed before)")
    r = env.step(_turn("nope"))
    assert r.observation.startswith(f"Recent steps:\n[2] nope -> {NOTHING_HAPPENS}\n\nBAD nope")
    with pytest.raises(ValueError, match="past max_steps=3"):
        env.step(_turn("nope"))
    assert cfg.episode_limits().max_turns == 3
    for bad, msg in ((dict(max_steps=0), "max_steps must be >= 1"),
                     (dict(invalid_penalty=-0.1), "must be >= 0"), (dict(history_steps=-1), "history_steps"),
                     (dict(max_observation_chars=5), "max_observation")):
        with pytest.raises(ValueError, match=msg):
            TextGameConfig(**bad)


@pytest.mark.slow
def test_episode_actions_spans_reward_and_truncation(game, heat_game_id):
    """Real episodes through run_episode with the real tokenizer: the action tokens are exactly the
    `<action>` spans; a win terminates with the running total; max_steps truncates (never terminates)."""
    tok = load_tokenizer()
    plan = walkthrough(None, heat_game_id)
    env = TextGameEnv(game, heat_game_id, prompt=ALFWORLD_PROMPT)
    turns = [scripted_turn("wander", "I am lost."),
             *[scripted_turn(a, f"step {i}") for i, a in enumerate(plan)]]
    traj = asyncio.run(run_episode(env, ScriptedEngine(tok, turns), tok, limits=env.config.episode_limits()))
    assert traj.terminated and not traj.truncated and traj.stop_reason == "won"
    assert (traj.reward == pytest.approx(10.0 - 0.1) and traj.num_turns == len(plan) + 1
            and traj.drift_tokens == 0)
    action_text = tok.decode([t for t, s in zip(traj.token_ids, traj.span, strict=True) if s == Span.ACTION])
    expected = "".join(f"<action>{a}</action>" for a in ["wander", *plan])
    # the end-of-turn token that closes each action-final turn is counted with the action
    assert action_text.replace(tok.eos_token, "") == expected

    short = TextGameEnv(game, heat_game_id, prompt=ALFWORLD_PROMPT, config=TextGameConfig(max_steps=2))
    traj = asyncio.run(run_episode(short, ScriptedEngine(tok, [scripted_turn(a) for a in plan]), tok,
                                   limits=short.config.episode_limits()))
    assert traj.truncated and not traj.terminated and traj.stop_reason == "max_turns"
    assert traj.num_turns == 2 and traj.reward == pytest.approx(0.0) and short.steps == 2
