"""The toy env: a synthetic multi-turn token game for tests and debug runs (not a benchmark).

Vocabulary (ids): 0 BOS/pad, 1 the observation "wrong", then `num_cues` cue tokens, `num_cues`
action tokens and `num_fillers` filler tokens. A task is a cue c; its right action is action
(c + 1) mod num_cues, so the policy has to read the cue.

An episode: the prompt is [BOS, cue]. Each turn the model writes `reasoning_tokens` tokens of
reasoning (span 1, any ids) and then one action token (span 2: the last token of the turn). The
right action ends the episode with reward 1; anything else gets the observation [wrong, cue]
(span 0, loss mask 0) and another turn, up to `max_turns` (then reward 0, truncated).

Episodes are sampled from any engine with the `RolloutEngine.generate` coroutine (duck-typed:
this module does not import the rollout package), so the engine's logprobs become the learner's
old log-probs exactly as in the real loop. The turns are token-level (no chat template, no
parser): the point is a task a 2-layer model learns in seconds on CPU. The policy is a random-init
model over this game's own vocabulary (`swerl.models.make_toy_model`).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Any

from swerl.structs import SamplingParams, Trajectory

BOS, WRONG = 0, 1


@dataclass(frozen=True)
class ToyEnvConfig:
    """The toy game's size (a config section: `env.toy`)."""

    num_cues: int = 3
    """Distinct tasks (and actions); the right action for cue c is action (c + 1) mod num_cues."""
    num_fillers: int = 4
    """Extra tokens that are neither cues nor actions (reasoning filler)."""
    reasoning_tokens: int = 3
    """Tokens of reasoning the model writes before its action in each turn."""
    max_turns: int = 3
    """Turns before the episode is cut (reward 0)."""
    latency_median_s: float = 0.0
    """Injected env time per episode, for benchmarks of long-tail rollouts (scripts/bench_async.py): each
    episode sleeps, after its last turn, a time drawn from a lognormal with this median and
    `latency_sigma`, from the task stream's seeded generator (so a seed fixes the draws). 0: none."""
    latency_sigma: float = 1.0
    """σ of the log of that latency (1.0: the slowest of 64 episodes takes ~10× the median)."""

    def __post_init__(self) -> None:
        if self.num_cues < 2:
            raise ValueError(f"env.toy.num_cues must be >= 2, got {self.num_cues}")
        if self.num_fillers < 0 or self.reasoning_tokens < 0:
            raise ValueError("env.toy.num_fillers and env.toy.reasoning_tokens must be >= 0")
        if self.max_turns < 1:
            raise ValueError(f"env.toy.max_turns must be >= 1, got {self.max_turns}")
        if self.latency_median_s < 0 or self.latency_sigma < 0:
            raise ValueError("env.toy.latency_median_s and env.toy.latency_sigma must be >= 0")

    @property
    def vocab_size(self) -> int:
        return 2 + 2 * self.num_cues + self.num_fillers

    def cue_token(self, cue: int) -> int:
        return 2 + cue

    def action_token(self, action: int) -> int:
        return 2 + self.num_cues + action

    def right_action(self, cue: int) -> int:
        return self.action_token((cue + 1) % self.num_cues)


async def toy_episode(engine: Any, cfg: ToyEnvConfig, cue: int, *, temperature: float = 1.0,
                      latency_s: float = 0.0) -> Trajectory:
    """Play one episode of the game on `engine` (then sleep `latency_s`, the injected env time); the
    Trajectory carries its reward."""
    ids, mask, span, logp, turn = [BOS, cfg.cue_token(cue)], [0, 0], [0, 0], [0.0, 0.0], [-1, -1]
    versions: list[int | None] = []
    params = SamplingParams(temperature=temperature, max_new_tokens=cfg.reasoning_tokens + 1)
    won = False
    for t in range(cfg.max_turns):
        gen = await engine.generate(list(ids), params)
        n = len(gen.token_ids)
        ids += gen.token_ids
        mask += [1] * n
        span += [1] * (n - 1) + [2]  # the last token of the turn is the action
        logp += gen.logprobs
        turn += [t] * n
        versions.append(getattr(gen, "weight_version", None))
        if gen.token_ids[-1] == cfg.right_action(cue):
            won = True
            break
        if t + 1 < cfg.max_turns:
            ids += [WRONG, cfg.cue_token(cue)]
            mask += [0, 0]
            span += [0, 0]
            logp += [0.0, 0.0]
            turn += [-1, -1]
    if latency_s:
        await asyncio.sleep(latency_s)
    return Trajectory(token_ids=tuple(ids), loss_mask=tuple(mask), span=tuple(span), logprobs=tuple(logp),
                      turn_index=tuple(turn), prompt_len=2, terminated=won, truncated=not won,
                      stop_reason="right_action" if won else "max_turns", reward=1.0 if won else 0.0,
                      num_turns=t + 1, num_tool_calls=t + 1,
                      turn_versions=() if None in versions else tuple(versions))  # type: ignore[arg-type]


async def toy_rollouts(engine: Any, cfg: ToyEnvConfig, cues: list[int], n: int, *,
                       temperature: float = 1.0,
                       rng: random.Random | None = None) -> tuple[list[Trajectory], list[int]]:
    """n episodes of each cue, all concurrently (the engine batches them); returns (trajectories,
    group index of each: the position of its cue in `cues`). `rng` draws the injected latencies
    (`latency_median_s`; none are drawn when it is 0, so the stream is untouched)."""
    jobs = [(g, cue) for g, cue in enumerate(cues) for _ in range(n)]
    lat = ([rng.lognormvariate(math.log(cfg.latency_median_s), cfg.latency_sigma) for _ in jobs]
           if cfg.latency_median_s and rng is not None else [0.0] * len(jobs))
    trajs = await asyncio.gather(*(toy_episode(engine, cfg, cue, temperature=temperature, latency_s=s)
                                   for (_, cue), s in zip(jobs, lat, strict=True)))
    return list(trajs), [g for g, _ in jobs]


def sample_cues(rng: random.Random, cfg: ToyEnvConfig, count: int) -> list[int]:
    return [rng.randrange(cfg.num_cues) for _ in range(count)]


async def toy_step(engine: Any, cfg: ToyEnvConfig, rng: random.Random, tasks: int, n: int,
                   temperature: float = 1.0) -> tuple[list[Trajectory], list[int]]:
    """One training step's episodes: `tasks` cues drawn from `rng`, `n` episodes each (see `toy_rollouts`)."""
    return await toy_rollouts(engine, cfg, sample_cues(rng, cfg, tasks), n, temperature=temperature, rng=rng)


def toy_success(trajectory: Trajectory) -> bool:
    """An episode won: it played the right action (reward 1)."""
    return (trajectory.reward or 0) > 0

