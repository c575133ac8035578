"""A model (or a scripted engine) on an env kind's tasks: the one evaluation path, on the runner.

`evaluate_async` takes a task set of the registry's kinds (`SWETaskSet`, `GameTaskSet`: the same ones the
training loop draws its rollouts from) and runs `k` episodes on each task through
`swerl.rollout.runner.EpisodeRunner`, `workers` at a time, every sandbox from `SandboxPools` (the caller's,
e.g. the training loop's kept across its steps, or the runner's own, made ahead while earlier episodes run).
The episode's task set says how it ends: a SWE episode is graded by the SWE env's finish hook (the submitted
patch when it submitted, else the tree it left: `SWEEnv.grade`), a game reports its win and score.
Evaluation only reads what the finished env holds and writes it down:

- `out/samples/<task>__<k>.json`: one record per episode (`EvalSample` for SWE, `GameEvalSample` for the
  games), written as the episode ends (atomically). A resumed run skips the samples already there and
  reruns those that failed for a harness reason (image, sandbox, engine, grading infrastructure): a failure
  is never a score, and never kept as one.
- `out/trajectories/<task>__<k>.json`: the token-exact trajectory of each episode that ran.
- the report (`swerl.eval.report`): SWE: `predictions.jsonl` (sample 0 of each instance, as the official
  harness scores a single-sample prediction), `report.json` with SWE-bench's run-report keys of sample 0 plus
  pass@k and the agent metrics over all k samples; games: success rate and mean score overall and per group;
  `report.md` the same in Markdown.

The toy game is played on the engine's own tokens, not on the runner (`evaluate_toy_async`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.agent.env import EpisodeSpec
from swerl.envs.registry import EnvKind, TaskSet
from swerl.envs.swe.tasks import SWETaskSet
from swerl.envs.textgame.tasks import GameTaskSet
from swerl.eval.model import with_model_engine
from swerl.eval.report import (
    GameEvalSample,
    atomic_write,
    load_record,
    mean,
    pass_at_k,
    write_game_report,
    write_model_report,
)
from swerl.eval.types import EvalSample
from swerl.rollout.runner import EpisodeRunner
from swerl.sandbox.pool import SandboxPools
from swerl.structs import EpisodeLimits, EpisodeResult, SamplingParams


@dataclass(frozen=True)
class _SWEFacts:
    """What a finished SWE episode's env holds, taken before the runner closes it (where it ran)."""

    patch: str
    grade: Any


@dataclass(frozen=True)
class _GameFacts:
    """What a finished text-game episode's env holds."""

    won: bool
    score: float
    episode_reward: float
    steps: int
    invalid_actions: int


@dataclass(frozen=True)
class _Records:
    """How the episodes of one kind of task set become sample records."""

    cls: type
    """The record type (`EvalSample` / `GameEvalSample`)."""
    file: Callable[[str, int], str]
    """file(task_id, sample): the record's file name under samples/ (and its trajectory's under
    trajectories/)."""
    facts: Callable[[Any], Any]
    """What the record needs from the env as the episode ends (the spec's `report` hook: it runs where
    the episode ran, on a cluster's sandbox host too)."""
    ran: Callable[[str, int, EpisodeResult], Any]
    """The record of an episode that ran (its facts in `EpisodeResult.report`)."""
    failed: Callable[[str, int, str, str, float], Any]
    """failed(task_id, sample, error, error_kind, seconds): the record of one that failed."""


def sample_path(out: Path, task_id: str, sample: int) -> Path:
    """The sample record of one episode (a game id may hold '/': ALFWorld's do)."""
    safe = task_id.strip("/").replace("/", "--")
    return out / "samples" / f"{safe}__{sample}.json"


def _swe_records(model_name: str) -> _Records:
    def facts(env: Any) -> _SWEFacts:
        return _SWEFacts(env.patch, env.last_grade)

    def ran(iid: str, s: int, res: EpisodeResult) -> EvalSample:
        tr, f, finish_s = res.trajectory, res.report, res.stats.finish_s
        assert tr is not None and isinstance(f, _SWEFacts)
        return EvalSample(instance_id=iid, sample=s, model_name_or_path=model_name, model_patch=f.patch,
                          grade=f.grade, stop_reason=tr.stop_reason, truncated=tr.truncated,
                          turns=tr.num_turns, tool_calls=tr.num_tool_calls, malformed=tr.num_malformed,
                          prompt_tokens=tr.prompt_len, generated_tokens=sum(tr.loss_mask),
                          total_tokens=len(tr.token_ids), episode_s=res.stats.wall_s - finish_s,
                          grade_s=finish_s, host=res.host)

    def failed(iid: str, s: int, error: str, kind: str, seconds: float) -> EvalSample:
        return EvalSample(instance_id=iid, sample=s, model_name_or_path=model_name, error=error,
                          error_kind=kind, episode_s=seconds)

    return _Records(EvalSample, lambda iid, s: sample_path(Path(), iid, s).name, facts, ran, failed)


def _game_records(model_name: str, group_of: Callable[[str], str]) -> _Records:
    def facts(env: Any) -> _GameFacts:
        last = env.last
        score = float(last.reward) if last is not None and last.done else 0.0
        return _GameFacts(won=env.won, score=score, episode_reward=env.total_reward, steps=env.steps,
                          invalid_actions=env.invalid_actions)

    def ran(gid: str, s: int, res: EpisodeResult) -> GameEvalSample:
        tr, f = res.trajectory, res.report
        assert tr is not None and isinstance(f, _GameFacts)
        return GameEvalSample(
            game_id=gid, sample=s, group=group_of(gid), model_name_or_path=model_name, won=f.won,
            score=f.score, episode_reward=f.episode_reward, steps=f.steps, invalid_actions=f.invalid_actions,
            turns=tr.num_turns, malformed=tr.num_malformed, stop_reason=tr.stop_reason,
            truncated=tr.truncated, generated_tokens=sum(tr.loss_mask), episode_s=res.stats.wall_s,
            host=res.host)

    def failed(gid: str, s: int, error: str, kind: str, seconds: float) -> GameEvalSample:
        return GameEvalSample(game_id=gid, sample=s, group=group_of(gid), model_name_or_path=model_name,
                              error=error, error_kind=kind, episode_s=seconds)

    return _Records(GameEvalSample, lambda gid, s: sample_path(Path(), gid, s).name, facts, ran, failed)


async def _run_samples(tasks: TaskSet, out: Path, records: _Records, *, engine: Any, tokenizer: Any,
                       model_name: str, k: int, workers: int, params: SamplingParams, limits: EpisodeLimits,
                       progress: bool, run_id: str | None,
                       pools: SandboxPools | None) -> dict[tuple[str, int], Any]:
    """Every task's `k` samples: those a previous run left, and the rest run now (see the module
    docstring)."""
    if k < 1 or workers < 1:
        raise ValueError(f"need k >= 1 and workers >= 1, got k={k}, workers={workers}")
    samples: dict[tuple[str, int], Any] = {}
    todo: dict[str, list[int]] = {}
    for tid in tasks.ids:
        for s in range(k):
            got = load_record(out / "samples" / records.file(tid, s), records.cls)
            if got is not None and got.model_name_or_path != model_name:
                raise ValueError(f"{out} holds samples of model {got.model_name_or_path!r}, not "
                                 f"{model_name!r}: evaluate another model into another --out directory")
            if got is not None and not got.error:
                samples[(tid, s)] = got
            else:
                todo.setdefault(tid, []).append(s)

    def save(tid: str, s: int, record: Any) -> None:
        atomic_write(out / "samples" / records.file(tid, s), record.to_json())
        samples[(tid, s)] = record

    def caught(spec: EpisodeSpec) -> EpisodeSpec:
        return dataclasses.replace(spec, report=records.facts)

    specs: list[EpisodeSpec] = []
    for group, tid in enumerate(tasks.ids):
        if tid not in todo:
            continue
        try:  # making a task runnable builds (or finds) its image
            made = await asyncio.to_thread(tasks.specs, tid, group, k)
        except Exception as e:  # this task's samples fail (a resumed run tries again); the others run
            kind = getattr(e, "failure_kind", "") or "image"
            for s in todo[tid]:
                save(tid, s, records.failed(tid, s, f"image: {type(e).__name__}: {e}", kind, 0.0))
            continue
        specs += [caught(sp) for sp in made if sp.sample in todo[tid]]

    def on_result(res: EpisodeResult) -> None:
        tid, s = res.task_id, res.sample
        if res.trajectory is None or res.report is None:
            failed = records.failed(tid, s, res.error or "the episode ended without its environment",
                                    res.error_kind or "harness", res.stats.wall_s)
            save(tid, s, dataclasses.replace(failed, host=res.host))
            return
        atomic_write(out / "trajectories" / records.file(tid, s), res.trajectory.to_json())
        save(tid, s, records.ran(tid, s, res))

    if specs:
        # engine_concurrency = workers: each episode has at most one generate call in flight, so --workers
        # alone says how many the engine sees (the runner's default, 32, would cap a larger --workers)
        async with EpisodeRunner(engine, tokenizer, params=params, limits=limits, max_episodes=workers,
                                 engine_concurrency=workers, max_containers=workers + 2, pools=pools,
                                 run_id=run_id, progress=progress,
                                 on_result=on_result) as runner:
            await runner.run(specs)
    return samples


async def evaluate_async(tasks: TaskSet, out_dir: str | Path, *, engine: Any, tokenizer: Any, model_name: str,
                         k: int = 1, workers: int = 1, params: SamplingParams | None = None,
                         limits: EpisodeLimits | None = None, progress: bool = True,
                         run_id: str | None = None, pools: SandboxPools | None = None) -> dict[str, Any]:
    """`k` episodes of the agent behind `engine` on every task of `tasks` (a `SWETaskSet` or a
    `GameTaskSet`), then the report (also written to out/report.json); see the module docstring. A text
    game's turn budget is its step budget (`TextGameConfig.max_steps` replaces `limits.max_turns`)."""
    out = Path(out_dir)
    params = params or SamplingParams()
    common = dict(engine=engine, tokenizer=tokenizer, model_name=model_name, k=k, workers=workers,
                  params=params, progress=progress, run_id=run_id, pools=pools)
    if isinstance(tasks, SWETaskSet):
        samples = await _run_samples(tasks, out, _swe_records(model_name), limits=limits or EpisodeLimits(),
                                     **common)  # type: ignore[arg-type]
        return write_model_report(list(tasks.instances.values()), samples, out, k=k, model_name=model_name)
    if isinstance(tasks, GameTaskSet):
        samples = await _run_samples(tasks, out, _game_records(model_name, tasks.options.group_of),
                                     limits=tasks.config.episode_limits(limits),
                                     **common)  # type: ignore[arg-type]
        return write_game_report(tasks.kind, tasks.ids, samples, out, k=k, model_name=model_name)
    raise TypeError(f"no evaluation records for a {type(tasks).__name__}: a SWETaskSet or a GameTaskSet")


def evaluate(tasks: TaskSet, out_dir: str | Path, *, model: str, engine: str = "hf",
             engine_url: str | None = None, tokenizer: str | None = None, seed: int | None = None,
             startup_timeout_s: float = 600.0, continuous: bool = False, engine_python: str | None = None,
             **kwargs: Any) -> dict[str, Any]:
    """`evaluate_async` with the engine and tokenizer of `model` (`swerl.eval.model.with_model_engine`;
    `continuous`: the hf engine batches continuously; `engine_python`: the interpreter a launched server
    runs in); the engine is closed after. Every worker may have a generate call in flight."""
    return with_model_engine(
        model, out_dir, engine=engine, engine_url=engine_url, tokenizer=tokenizer, seed=seed,
        startup_timeout_s=startup_timeout_s, continuous=continuous, python=engine_python,
        concurrency=kwargs.get("workers", 1),
        run=lambda eng, tok: evaluate_async(tasks, out_dir, engine=eng, tokenizer=tok, model_name=model,
                                            **kwargs))


def heldout_tasks(kind: EnvKind, section: Any, *, split: str = "", limit: int = 0, max_steps: int) -> TaskSet:
    """The task set of `kind` on a held-out split (`split`, default the kind's own) of the data its config
    section `section` names, first `limit` tasks (0: all): what training's evaluation runs on."""
    if kind.task_set is None:
        raise ValueError(f"env kind {kind.name!r} is played on the engine's tokens, not on the runner")
    changes: dict[str, Any] = {"split": split or kind.heldout_split, "limit": limit}
    if any(f.name == "instance_ids" for f in dataclasses.fields(section)):
        changes["instance_ids"] = ()  # a training selection names training tasks, not held-out ones
    return kind.task_set(dataclasses.replace(section, **changes), max_steps=max_steps)


# ---- the toy game (swerl.envs.toy): every cue k times, the report keys `val_metrics` reads ---------------


async def evaluate_toy_async(engine: Any, cfg: Any, out_dir: str | Path, *, k: int = 1,
                             temperature: float = 1.0, limit: int = 0) -> dict[str, Any]:
    """`k` episodes of each cue of the toy game (`cfg`: its `ToyEnvConfig`; the first `limit` cues, 0:
    all) on `engine`; report.json with the keys of `game_report` that `val_metrics` reads."""
    from swerl.envs.toy import toy_episode

    cues = list(range(cfg.num_cues))[:limit or None]
    trajs = await asyncio.gather(*(toy_episode(engine, cfg, c, temperature=temperature)
                                   for c in cues for _ in range(k)))
    won = [sum(t.reward == 1.0 for t in trajs[i * k:(i + 1) * k]) for i in range(len(cues))]
    rep = {
        "kind": "toy", "games": len(cues), "k": k, "samples_ran": len(trajs), "sample_errors": 0,
        "success_rate": mean([float(t.reward == 1.0) for t in trajs]),
        "pass_at_k": {str(j): mean([pass_at_k(k, c, j) for c in won]) for j in range(1, k + 1)},
        "mean_episode_reward": mean([t.reward or 0.0 for t in trajs]),
        "mean_turns": mean([t.num_turns for t in trajs]),
        "mean_tokens": mean([sum(t.loss_mask) for t in trajs]),
    }
    atomic_write(Path(out_dir) / "report.json", json.dumps(rep, indent=2) + "\n")
    return rep
