"""The Env contract: `swerl.envs.checker.check_env` over every env kind that runs here (`ENV_KINDS` in
tests/contract/conftest.py), on a script that finishes the task and on one that spends the env's whole
turn budget without finishing it; then the checker's own checks, each shown to catch the env that
breaks it (a checker that cannot fail proves nothing); then the toy game, which is not an `Env`,
against the same ending and determinism rules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from swerl.envs.checker import TRUNCATION_REASONS, EnvCheckError, check_env
from swerl.structs import EnvStart, Generation, ParsedTurn, StepResult


def _check(case: Any, script: tuple[str, ...], ends: str) -> Any:
    return check_env(case.make_env, script, ends=ends, after_done=case.after_done,
                     before_reset=case.before_reset, reset_restarts=case.reset_restarts, name=case.kind)


def test_finishing_the_task_keeps_the_contract(env_case):
    """The finishing script: types, endings, step after done, determinism, restart, close (the checker);
    and the ending is the task's own, with the reward its rules give."""
    report = _check(env_case, env_case.finish, "terminated")
    last = report.steps[-1]
    assert last.terminated and last.reason == env_case.finish_reason and last.reason not in TRUNCATION_REASONS
    assert last.reward == pytest.approx(env_case.finish_reward, abs=1e-9)
    assert not any(s.terminated for s in report.steps[:-1])
    if env_case.finished is not None:
        assert env_case.finished(last), last.observation


def test_running_out_of_turns_is_never_a_termination(env_case):
    """A script as long as the env's budget that never finishes the task: no step terminates (the cut is
    the episode loop's truncation), each reports the reward the rules give, and it replays identically."""
    report = _check(env_case, env_case.unfinished, "open")
    assert len(report.steps) == len(env_case.unfinished)
    assert [s.reward for s in report.steps] == pytest.approx(list(env_case.unfinished_rewards), abs=1e-9)
    assert all(not s.terminated and s.reason == "" and s.result is None for s in report.steps)


def test_close_releases_what_the_env_holds(env_case):
    """After a played turn and close() (twice), the env holds nothing of its own and its figures stay
    readable; an env without close() holds nothing (the runner owns and closes the sandbox)."""
    from swerl.agent.format import parse_turn

    env = env_case.make_env()
    start = env.reset()
    step = env.step(parse_turn(env_case.finish[0], env.action_format, start.tools))
    close = getattr(env, "close", None)
    if env_case.released is None and close is None:
        assert env_case.kind == "swe", "only the SWE env leaves its resource (the sandbox) to the runner"
        return
    assert close is not None, f"{env_case.kind} holds a resource but has no close()"
    figures = ("steps", "total_reward", "won")  # what TextGameEnv keeps for the episode's report
    before = {k: getattr(env, k) for k in figures if hasattr(env, k)}
    close()
    close()
    if env_case.released is not None:
        assert env_case.released(env)
    assert {k: getattr(env, k) for k in before} == before
    if before:
        assert before["steps"] == 1 and step.reward == before["total_reward"]


# ---- the checker catches what it checks ------------------------------------------------------------


@dataclasses.dataclass
class Counter:
    """A minimal well-behaved Env: count up with `<answer>n</answer>`; the answer 3 ends it (reason
    `done`). Each test below breaks one rule by a subclass or an option."""

    seed: int = 0
    n: int = -1
    action_format: Any = None

    def __post_init__(self) -> None:
        from swerl.envs.games.env import ANSWER_FORMAT

        self.action_format = ANSWER_FORMAT

    def reset(self) -> EnvStart:
        from swerl.structs import ChatMessage

        self.n = 0
        opening = (ChatMessage("system", "Count."), ChatMessage("user", f"Start at {self.seed}."))
        return EnvStart(messages=opening)

    def step(self, turn: ParsedTurn) -> StepResult:
        if self.n < 0:
            raise ValueError("step before reset")
        if self.n >= 3:
            raise ValueError("the episode is over")
        self.n += 1
        if self.n == 3:
            return StepResult(observation="three", terminated=True, reward=1.0, reason="done")
        return StepResult(observation=str(self.n), reward=0.0)


SCRIPT = ("<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>")


def test_the_well_behaved_counter_passes():
    report = check_env(Counter, SCRIPT)
    assert [s.observation for s in report.steps] == ["1", "2", "three"]
    assert report.steps[-1].reason == "done"
    assert [t.tool_calls[0].name for t in report.turns] == ["answer"] * 3


class TruncatesItself(Counter):
    def step(self, turn: ParsedTurn) -> StepResult:
        r = super().step(turn)
        return dataclasses.replace(r, reason="max_turns") if r.terminated else r


class Unseeded(Counter):
    _draws = random.Random(1)

    def reset(self) -> EnvStart:
        self.seed = self._draws.randrange(10**9)  # a fresh draw per env: the factory's seed is not honoured
        return super().reset()


class ReasonWithoutEnd(Counter):
    def step(self, turn: ParsedTurn) -> StepResult:
        r = super().step(turn)
        return r if r.terminated else dataclasses.replace(r, reason="thinking")


class GoesOnAfterDone(Counter):
    def step(self, turn: ParsedTurn) -> StepResult:
        self.n = min(self.n, 2)
        return super().step(turn)


class StepsBeforeReset(Counter):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.n = 0  # as if reset had run


class ListOpening(Counter):
    def reset(self) -> Any:
        return dataclasses.replace(super().reset(), messages=list(super().reset().messages))


class IntFlag(Counter):
    def step(self, turn: ParsedTurn) -> StepResult:
        return dataclasses.replace(super().step(turn), error=0)  # type: ignore[arg-type]


class NoRestart(Counter):
    def reset(self) -> EnvStart:
        self.seed += 1
        return super().reset()


class CloseOnce(Counter):
    closed = False

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True


@pytest.mark.parametrize("make_env, kwargs, check", [
    (TruncatesItself, {}, "step 3: terminated with reason 'max_turns', which is a truncation"),
    (Unseeded, {"reset_restarts": False}, "determinism (a second env): reset differs: messages"),
    (ReasonWithoutEnd, {}, "step 1: not terminated, yet reason 'thinking'"),
    (GoesOnAfterDone, {}, "step after done"),
    (StepsBeforeReset, {}, "step before reset"),
    (ListOpening, {}, "reset: messages must be a non-empty tuple"),
    (IntFlag, {}, "step 1: error is 0, not a bool"),
    (NoRestart, {}, "restart (reset again): reset differs: messages"),
    (CloseOnce, {}, "close: the second close() raised RuntimeError"),
    (Counter, {"ends": "open"}, "ending: step 3 of 3 terminated"),
])
def test_the_checker_catches_each_broken_rule(make_env: Callable[[], Any], kwargs: dict, check: str):
    with pytest.raises(EnvCheckError) as e:
        check_env(make_env, SCRIPT, **kwargs)
    assert check in str(e.value)
    assert str(e.value).startswith(f"{make_env.__name__}: ")  # it names the env


def test_a_script_that_ends_early_or_never_is_reported():
    with pytest.raises(EnvCheckError, match=r"ending: the script's last turn \(2\) did not terminate"):
        check_env(Counter, SCRIPT[:2])
    with pytest.raises(ValueError, match="turn 1 is not a well-formed action"):
        check_env(Counter, ["<action>1</action>"])


def test_every_env_made_is_closed_even_when_a_check_fails():
    made: list[CloseOnce] = []

    class Leaky(CloseOnce):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)

        def step(self, turn: ParsedTurn) -> StepResult:
            return dataclasses.replace(super().step(turn), reward=float("nan"))

    with pytest.raises(EnvCheckError, match="reward must be None or a finite number"):
        check_env(Leaky, SCRIPT)
    assert len(made) == 1 and made[0].closed


# ---- the toy game (token-level, not an Env) ---------------------------------------------------------


class ToyPolicy:
    """Plays `reasoning_tokens` filler ids, then an action: the right one from turn `wins_at` on (never
    when None); the rest of the time the action after the right one (always wrong)."""

    def __init__(self, cfg: Any, wins_at: int | None) -> None:
        self.cfg, self.wins_at = cfg, wins_at
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], params: Any) -> Generation:
        cfg = self.cfg
        self.prompts.append(list(prompt_ids))
        cue = prompt_ids[1] - 2
        turn = (len(prompt_ids) - 2) // (cfg.reasoning_tokens + 3)
        right = (cue + 1) % cfg.num_cues
        act = right if self.wins_at is not None and turn >= self.wins_at else (right + 1) % cfg.num_cues
        filler = 2 + 2 * cfg.num_cues
        ids = (filler,) * cfg.reasoning_tokens + (2 + cfg.num_cues + act,)
        return Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), finish_reason="length")


@pytest.mark.parametrize("wins_at", [0, 1, None])
def test_toy_episodes_end_either_terminated_or_truncated(toy_game, wins_at):
    """Winning at turn k terminates after k + 1 turns with reward 1; never winning is truncated at
    max_turns with reward 0 (never both, never neither); between turns the game shows [WRONG, cue]."""
    cfg = toy_game.ToyEnvConfig(num_cues=3, reasoning_tokens=2, max_turns=3)
    policy = ToyPolicy(cfg, wins_at)
    traj = asyncio.run(toy_game.toy_episode(policy, cfg, cue=1))
    turns = cfg.max_turns if wins_at is None else wins_at + 1
    assert (traj.terminated, traj.truncated) == (wins_at is not None, wins_at is None)
    assert traj.stop_reason == ("max_turns" if wins_at is None else "right_action")
    assert traj.reward == (0.0 if wins_at is None else 1.0) and traj.num_turns == turns
    # the ids, independently: [BOS, cue 1 = id 3], then per turn 2 fillers (id 8) + an action (ids 5..7),
    # the right one for cue 1 being action 2 = id 7, and [WRONG = 1, cue] after each wrong turn
    right, wrong = 2 + 3 + 2, 2 + 3 + 0  # the policy's wrong action is the one after the right: (2 + 1) % 3
    expected = [0, 3]
    for t in range(turns):
        expected += [8, 8, right if wins_at is not None and t >= wins_at else wrong]
        if t < turns - 1:
            expected += [1, 3]
    assert list(traj.token_ids) == expected
    assert policy.prompts == [expected[:2 + 5 * t] for t in range(turns)]


def test_toy_rollouts_are_determined_by_the_seed(toy_game):
    """The same seed draws the same cues and (with a policy that is a function of what it sees) the same
    trajectories; another seed draws other cues."""
    cfg = toy_game.ToyEnvConfig(num_cues=5)

    def play(seed: int) -> tuple[list[int], list[Any]]:
        cues = toy_game.sample_cues(random.Random(seed), cfg, 12)
        trajs, _ = asyncio.run(toy_game.toy_rollouts(ToyPolicy(cfg, 1), cfg, cues, 2))
        return cues, trajs

    cues, trajs = play(7)
    assert play(7) == (cues, trajs)
    assert play(8)[0] != cues
    assert {t.num_turns for t in trajs} == {2} and all(t.terminated for t in trajs)
