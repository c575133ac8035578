"""THE training loop, top to bottom: `train(cfg)`.

    sample tasks → n rollouts per task on the rollout engine (runner; sandboxes) → rewards
    [DAPO: re-sample groups whose rewards are all equal until the batch is full]
    → learner update (advantages → AEM → reference pass → clipped loss; epochs × mini-batches)
    → weight sync to the rollout engine → metrics row (<run_dir>/metrics.jsonl, TensorBoard, W&B)
    → checkpoint every `checkpoint_every` steps; a run directory with checkpoints is resumed.

Configuration is one `TrainConfig` tree (`swerl.train_config`; YAML + dotted overrides via
`swerl.config.load`). Every method is a switch under `algo`; all off is plain GRPO.

Environments (`env.kind`): `swe` (SWE-bench-schema tasks in Docker sandboxes, graded by SWE-bench's
own grading), `alfworld` / `webshop` (text games through `swerl.envs.textgame`, in sandboxes or in
process) and `toy` (the synthetic game of `swerl.envs.toy`, driven straight on the engine, for
tests); the kinds are `swerl.envs.registry`'s.
Engines (`rollout.engine`, each set in the section of its name, `rollout.hf` / `rollout.vllm` /
`rollout.sglang`; `swerl.rollout.config`): `hf` (in process; weights synced as tensors), `vllm` /
`sglang` (servers; weights synced through an HF checkpoint directory the server reloads).
With `async.max_staleness` k >= 1 (`swerl.asyncrl`), the rollouts of up to k later steps run, on a
background event loop, while a step trains; the loop below is the same, taking each step's rollouts
from that producer and pausing it around the weight sync (and evaluation).
Nothing imports this module except the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from swerl.asyncrl import AheadRollouts, Group, event_loop
from swerl.config import to_dict
from swerl.files import atomic_write
from swerl.learner import Learner, collate, make_learner
from swerl.learner.checkpoint import agreed_checkpoint
from swerl.learner.dist import (
    broadcast_object,
    init_distributed,
    probe_storage,
    shard_rows_by_group,
    share_directory,
)
from swerl.models import make_toy_model
from swerl.rollout.factory import open_engine
from swerl.runlog import TensorBoardWriter, TrainDisplay, WandbWriter, grouped_update_metrics
from swerl.structs import EpisodeResult, SamplingParams, Trajectory
from swerl.train_config import TrainConfig, check_resume

# ---- setup: model, tokenizer, tasks, engine ---------------------------------------------------------


def _check_paths(cfg: TrainConfig) -> None:
    """Fail before any work on a model / tokenizer that is neither a local directory nor reachable."""
    from swerl.models import check_model_source
    from swerl.models.shipped import SHIPPED

    if cfg.model.path and cfg.model.path not in SHIPPED:  # a shipped model is imported when it is used
        check_model_source(cfg.model.path, what="model.path")
    if cfg.model.tokenizer:
        check_model_source(cfg.model.tokenizer, what="model.tokenizer", marker="tokenizer_config.json")
    from swerl.agent.compact import COMPACT_FILE

    source = cfg.model.tokenizer or cfg.model.path
    if source and (Path(source) / COMPACT_FILE).is_file() and cfg.rollout.engine != "hf":
        raise ValueError(f"model {source!r} has a compact vocabulary ({COMPACT_FILE}), which only the "
                         f"in-process engine serves: set rollout.engine=hf (not {cfg.rollout.engine!r})")


def _initial_model_dir(cfg: TrainConfig, run_dir: Path) -> str:
    """The initial policy as an HF directory (a tiny random-init Qwen2 when model.path is empty; a shipped
    model's name: its imported directory, imported on first use)."""
    if cfg.model.path:
        from swerl.models.shipped import resolve_model

        return resolve_model(cfg.model.path)
    from swerl.models import make_tiny_qwen

    m = cfg.model
    return str(make_tiny_qwen(run_dir / "init_model", hidden_size=m.hidden_size, num_layers=m.num_layers,
                              num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                              intermediate_size=m.intermediate_size, seed=m.seed,
                              tie_word_embeddings=cfg.rollout.engine != "vllm"))


def _load_policy(cfg: TrainConfig, model_dir: str | None, dtype: torch.dtype) -> Any:
    """The initial policy in `dtype`, built anew on each call (the same weights: a checkpoint or a
    seeded init), so the learner can call it under ZeRO-3's partitioned construction."""
    game = cfg.env.spec.engine_game
    if game is not None:
        m = cfg.model
        return make_toy_model(game.vocab_size(cfg.env.section), hidden_size=m.hidden_size,
                              num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                              intermediate_size=m.intermediate_size, seed=m.seed).to(dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)


async def _open_engine(cfg: TrainConfig, policy: Any, model_dir: str | None, run_dir: Path,
                       log: Callable[[str], None] | None = None) -> Any:
    """The rollout engine: `policy` (a copy the learner does not train) in process, or a server on
    `model_dir` (its log in `run_dir`)."""
    r = cfg.rollout
    model = policy if r.engine == "hf" else model_dir
    assert model is not None
    engine = await open_engine(r.engine_config, model, concurrency=r.engine_concurrency, log_dir=run_dir,
                               on_wait=log)
    if r.engine != "hf":
        from swerl.rollout.weight_sync import check_disk_sync

        try:
            check_disk_sync(r, engine.urls)  # a server elsewhere cannot read this machine's disk
        except BaseException:
            await engine.close()
            raise
    return engine


def _sandbox_pools(cfg: TrainConfig, main: bool, log: Callable[[str], None] | None) -> Any:
    """Rank 0's sandbox pools for the whole run (`rollout.warm_sandboxes`): on an event loop of their
    own, so what they make ahead is made while the learner works; leaving the `with` removes every
    container. On a Ray cluster (`cluster.backend: ray`), the fleet of sandbox hosts instead: the runner
    sends each episode to one, where it runs next to its sandbox. Nothing for a game played on the
    engine (toy) or the other ranks."""
    if not main or cfg.env.spec.task_set is None:
        return contextlib.nullcontext()
    from swerl.sandbox import lifecycle

    r = cfg.rollout
    if cfg.cluster.enabled:
        from swerl.cluster import Fleet

        return Fleet(cfg.cluster, run_id=lifecycle.default_run_id(), warm=r.warm, log=log)
    from swerl.sandbox.pool import SandboxPools

    return SandboxPools(warm=r.warm, max_containers=r.max_episodes + r.warm)


async def _sync_weights(cfg: TrainConfig, engine: Any, learner: Learner, tokenizer: Any, run_dir: Path,
                        step: int) -> None:
    """The engine (rank 0's; None on the others) takes the learner's weights: tensors in process, or an
    HF directory a server reloads (written atomically; the previous step's directory is removed once
    the server has moved on). Every rank calls this: gathering ZeRO-3 weights is collective.
    `rollout.weight_sync: memory`: streamed in buckets through the engine's own weight-update API
    instead (`swerl.rollout.weight_sync`), nothing written."""
    if cfg.rollout.weight_sync == "memory":
        from swerl.rollout.weight_sync import sync_in_memory

        await sync_in_memory(cfg.rollout, engine, learner)
        return
    if cfg.rollout.engine == "hf":
        weights = learner.policy_state_dict()
        if engine is not None:
            await engine.update_weights(weights)
        return
    weights_dir = Path(cfg.rollout.weights_dir) if cfg.rollout.weights_dir else run_dir / "weights"
    target = weights_dir / f"step_{step:08d}"
    learner.export_hf(target, tokenizer=tokenizer)
    if engine is None:
        return
    await engine.update_weights(target)
    for old in weights_dir.glob("step_*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)


# ---- rollouts -----------------------------------------------------------------------------------------


@dataclass
class _Rollouts:
    """One step's episodes: what the learner trains on and what the metrics row reports."""

    trajectories: list[Trajectory]
    groups: list[int]
    results: list[EpisodeResult]
    rounds: int
    metrics: dict[str, Any] = field(default_factory=dict)
    """The producer's `async/` numbers (async training only)."""


def _usable(cfg: TrainConfig, r: EpisodeResult) -> bool:
    """Failed episodes (no trajectory, or no reward) are never trained on; drifted ones optionally."""
    t = r.trajectory
    return t is not None and t.reward is not None and not (cfg.rollout.drop_drift and t.drift_detected)


def _collect(aio: asyncio.Runner, cfg: TrainConfig, engine: Any, tokenizer: Any, tasks: Any,
             task_rng: random.Random, run_dir: Path, ui: TrainDisplay, step: int | None = None,
             pools: Any = None) -> _Rollouts:
    """Sample tasks, run `group_size` episodes of each; with the DAPO filter, replace groups whose
    rewards are all equal by fresh tasks for up to `dapo_max_rounds` more rounds. `step` tags the rows
    of rollouts.jsonl; `pools`: the run's sandbox pools."""
    game = cfg.env.spec.engine_game
    if game is not None:
        trajs, groups = aio.run(game.rollouts(engine, cfg.env.section, task_rng, cfg.tasks_per_step,
                                                  cfg.group_size, cfg.algo.temperature))
        return _Rollouts(trajs, groups, [], 1)

    from swerl.rollout.runner import run_episodes

    kept: list[list[EpisodeResult]] = []
    results: list[EpisodeResult] = []
    rounds = 0
    max_rounds = 1 + (cfg.dapo_max_rounds if cfg.algo.dapo_filter else 0)
    while len(kept) < cfg.tasks_per_step and rounds < max_rounds:
        need = cfg.tasks_per_step - len(kept)
        ids = [task_rng.choice(tasks.ids) for _ in range(need)]
        tasks.prepare(ids)
        specs = [s for g, tid in enumerate(ids) for s in tasks.specs(tid, g, cfg.group_size)]
        got = aio.run(run_episodes(
            specs, engine, tokenizer, params=cfg.rollout.sampling(cfg.algo.temperature),
            limits=cfg.rollout.limits(), max_episodes=cfg.rollout.max_episodes,
            engine_concurrency=cfg.rollout.engine_concurrency, engine_timeout_s=cfg.rollout.engine_timeout_s,
            pools=pools, results_path=run_dir / "rollouts.jsonl", train_step=step, progress=ui.episodes))
        results.extend(got)
        rounds += 1
        keep_any = not cfg.algo.dapo_filter or rounds == max_rounds  # the last round keeps what it has
        for g in range(need):
            group = [r for r in got if r.group == g and _usable(cfg, r)]
            rewards = {r.trajectory.reward for r in group}  # type: ignore[union-attr]
            # failed members are excluded, never scored; the group trains on the rest when enough remain
            # for a group baseline (2, or 1 for reinforce), else it is dropped (DAPO samples a fresh one)
            if len(group) >= min(cfg.group_size, 1 if cfg.algo.estimator == "reinforce" else 2) and (
                    keep_any or len(rewards) > 1):
                kept.append(group)
    trajs = [r.trajectory for group in kept for r in group]  # type: ignore[misc]
    groups = [g for g, group in enumerate(kept) for _ in group]
    return _Rollouts(trajs, groups, results, rounds)  # type: ignore[arg-type]


def _group_player(cfg: TrainConfig, tokenizer: Any, tasks: Any, task_rng: random.Random, run_dir: Path,
                  pools: Any) -> Callable[[Any, int], Any]:
    """Async training's unit of work: one rollout group (a task, `group_size` episodes) on the engine it is
    given, as `_collect` runs them; the members too few to train on leave the group empty."""
    game = cfg.env.spec.engine_game
    need = min(cfg.group_size, 1 if cfg.algo.estimator == "reinforce" else 2)
    # the run's pools plan one run at a time (a run's `begin` retires the images it does not name), so
    # groups running side by side each get pools of their own, removed when the group ends
    shared = pools if max(1, cfg.rollout.max_episodes // cfg.group_size) == 1 else None
    own = {} if shared is not None else {"warm": min(cfg.rollout.warm, cfg.group_size),
                                         "max_containers": cfg.group_size}

    async def play(engine: Any, step: int) -> Group:
        if game is not None:
            trajs, _ = await game.rollouts(engine, cfg.env.section, task_rng, 1, cfg.group_size,
                                           cfg.algo.temperature)
            return Group(tuple(trajs))
        from swerl.rollout.runner import run_episodes

        tid = task_rng.choice(tasks.ids)
        await asyncio.to_thread(tasks.prepare, [tid])
        got = await run_episodes(
            tasks.specs(tid, 0, cfg.group_size), engine, tokenizer,
            params=cfg.rollout.sampling(cfg.algo.temperature), limits=cfg.rollout.limits(),
            max_episodes=cfg.rollout.max_episodes, engine_concurrency=cfg.rollout.engine_concurrency,
            engine_timeout_s=cfg.rollout.engine_timeout_s, pools=shared, **own,
            results_path=run_dir / "rollouts.jsonl", train_step=step, progress=False)
        usable = [r.trajectory for r in got if _usable(cfg, r)]
        return Group(tuple(usable) if len(usable) >= need else (), tuple(got))  # type: ignore[arg-type]

    return play


def _ahead(cfg: TrainConfig, aio: Any, engine: Any, play: Callable[[Any, int], Any], start: int,
           main: bool) -> Any:
    """Rank 0's rollout producer for async training (`async.max_staleness` >= 1), else nothing."""
    if not main or not cfg.async_.enabled:
        return contextlib.nullcontext()
    groups_at_once = (None if cfg.env.spec.engine_game is not None
                      else max(1, cfg.rollout.max_episodes // cfg.group_size))
    return AheadRollouts(aio, engine, play, cfg.async_, tasks_per_step=cfg.tasks_per_step, version=start,
                         max_groups=groups_at_once)


def _rollout_row(cfg: TrainConfig, ro: _Rollouts) -> dict[str, Any]:
    """Episode-level numbers of one step (`rollout/`, `reward/success_rate`): success, failures,
    truncation, turns, tokens, time split."""
    trajs = ro.trajectories
    row: dict[str, Any] = {
        "rollout/episodes_trained": len(trajs),
        "rollout/turns_mean": sum(t.num_turns for t in trajs) / len(trajs) if trajs else math.nan,
        "rollout/seq_len_mean": sum(len(t.token_ids) for t in trajs) / len(trajs) if trajs else math.nan,
        "rollout/truncated_rate": sum(t.truncated for t in trajs) / len(trajs) if trajs else math.nan,
    }
    success = cfg.env.spec.success
    if cfg.env.spec.engine_game is not None:  # no runner results: only the trajectories
        row["reward/success_rate"] = sum(success(t) for t in trajs) / len(trajs)
        return row
    done = [r for r in ro.results if r.trajectory is not None]
    failed = [r for r in ro.results if r.trajectory is None]
    row.update({
        "reward/success_rate": (sum(success(r.trajectory) for r in done) / len(done)) if done else math.nan,
        "reward/episode_mean": ((sum(r.trajectory.reward or 0.0 for r in done) / len(done))
                                if done else math.nan),
        "reward/tamper_rate": ((sum(bool(r.trajectory.tampered_files or r.trajectory.tampered) for r in done)
                                / len(done)) if done else math.nan),
        "rollout/episodes_run": len(ro.results),
        "rollout/episodes_failed": len(failed),
        "rollout/failed_rate": len(failed) / max(1, len(ro.results)),
        **{f"rollout/failed/{kind}": n
           for kind, n in sorted(Counter(r.error_kind or "harness" for r in failed).items())},
        "rollout/episodes_drift": sum(r.trajectory is not None and r.trajectory.drift_detected
                                      for r in ro.results),
        "rollout/dapo_rounds": ro.rounds,
        "rollout/malformed_per_episode": ((sum(r.stats.malformed for r in done) / len(done))
                                          if done else math.nan),
        "rollout/generated_tokens": sum(r.stats.generated_tokens for r in ro.results),
        "rollout/engine_s_mean": sum(r.stats.engine_s for r in ro.results) / max(1, len(ro.results)),
        "rollout/env_s_mean": sum(r.stats.env_s for r in ro.results) / max(1, len(ro.results)),
        **{f"rollout/host/{h}": n for h, n in sorted(Counter(r.host for r in ro.results if r.host).items())},
    })
    return row


# ---- bookkeeping --------------------------------------------------------------------------------------


def _append_jsonl(path: Path, row: dict[str, Any]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    with open(path, "a") as f:
        f.write(json.dumps(clean) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_rows(path: Path, last_step: int) -> None:
    """Drop the rows of a JSONL file (metrics.jsonl, rollouts.jsonl) written for steps past the one the
    run resumes from; rows without a step (written by an older swerl) stay, a torn line goes."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line).get("train_step")
        except (ValueError, AttributeError):
            continue  # a torn last line
        if step is None or step <= last_step:
            keep.append(line)
    atomic_write(path, "".join(line + "\n" for line in keep))  # a crash leaves the old file or the new


def _step_line(cfg: TrainConfig, row: dict[str, Any]) -> str:
    """The log line of one step: headline numbers and where the time went."""
    def g(key: str) -> float:
        v = row.get(key)
        return math.nan if v is None or isinstance(v, bool) else float(v)

    val = (f" val success {g('val/success_rate'):.2f}" if "val/success_rate" in row else "")
    return (f"step {row['train_step']}/{cfg.steps} reward {g('reward/mean'):.3f} success "
            f"{g('reward/success_rate'):.2f}{val} loss {g('actor/loss'):+.4f} "
            f"entropy {g('actor/entropy'):.3f} grad_norm {g('actor/grad_norm'):.3f} "
            f"({g('timing_s/step'):.2f}s: rollout {g('timing_s/rollout'):.1f}s, "
            f"learn {g('timing_s/learn'):.1f}s, sync {g('timing_s/sync'):.1f}s"
            + (f", eval {g('timing_s/eval'):.1f}s" if val else "") + ")")


def _validate(aio: asyncio.Runner, cfg: TrainConfig, engine: Any, tokenizer: Any, run_dir: Path, step: int,
              pools: Any = None) -> dict[str, float]:
    """The policy on the held-out split, through the evaluation code `swerl eval` runs (reports under
    <run_dir>/eval/step_N/; the episodes take their sandboxes from the run's `pools`); returns the
    `val/` metrics. The hf engine samples with `eval.seed`, and training's sampling stream is restored
    after, so evaluating does not change what training samples."""
    from swerl.eval.episodes import evaluate_async, evaluate_toy_async, heldout_tasks
    from swerl.eval.report import val_metrics

    e, spec = cfg.eval, cfg.env.spec
    out = run_dir / "eval" / f"step_{step:08d}"
    name = f"{run_dir.name}@step{step}"
    params = SamplingParams(temperature=e.temperature, max_new_tokens=cfg.rollout.max_new_tokens)
    gen = getattr(engine, "generator", None)
    state = gen.get_state() if gen is not None else None
    if gen is not None:
        gen.manual_seed(e.seed)
    try:
        if spec.engine_game is not None:
            rep = aio.run(evaluate_toy_async(engine, cfg.env.section, out, k=e.k,
                                             temperature=e.temperature, limit=e.limit))
        else:  # swe and the text games: the held-out task set through `swerl eval`'s episode path
            tasks = heldout_tasks(spec, cfg.env.section, split=e.split, limit=e.limit,
                                  max_steps=cfg.rollout.max_turns)
            rep = aio.run(evaluate_async(
                tasks, out, engine=engine, tokenizer=tokenizer, model_name=name, k=e.k,
                workers=cfg.rollout.max_episodes, params=params, limits=cfg.rollout.limits(), progress=False,
                pools=pools))
    finally:
        if gen is not None:
            gen.set_state(state)
    return val_metrics(rep)


# ---- the loop -----------------------------------------------------------------------------------------


def train(cfg: TrainConfig, *, log: Callable[[str], None] | None = print,
          force_resume: bool = False) -> list[dict[str, Any]]:
    """Run (or resume) a training run; returns the metrics rows of the steps run in this call.

    Launched with torchrun (learner.backend deepspeed), every rank runs this function: rank 0 owns the
    rollout engine, the tasks and the run directory's files; the episodes are broadcast and each rank
    trains on whole rollout groups of them (DeepSpeed averages the gradients). A run directory that
    holds another experiment is refused (`check_resume`) unless `force_resume`."""
    _check_paths(cfg)
    check_resume(cfg, force=force_resume)
    from swerl.sandbox import lifecycle

    lifecycle.install_handlers()  # SIGTERM unwinds through the cleanup below (the engine's server goes too)
    # one event loop for the whole run: the engine's client and its in-flight state live on it from the
    # first rollout to close (the sandbox pools keep a loop of their own, so they work while the learner
    # does); async training's runs in a thread of its own, so its rollouts go on while the learner works too
    with (init_distributed(cfg.learner.dist_backend, required=cfg.learner.needs_process_group) as rank,
          event_loop(cfg.async_) as aio):
        main = rank.is_main
        log = log if main else None
        run_dir = Path(cfg.run_dir)
        metrics_path = run_dir / "metrics.jsonl"
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        # ranks on several nodes: one shared run directory, or one per node (each node then checkpoints to
        # and resumes from its own disk)
        storage = probe_storage(run_dir)
        torch.manual_seed(cfg.seed)
        task_rng = random.Random(cfg.seed)

        # tasks, tokenizer, policy; the engine samples from its own copy of the policy, synced every step
        tasks: Any = None
        tokenizer: Any = None
        model_dir: str | None = None
        make_tasks = cfg.env.spec.task_set
        if make_tasks is not None:  # a game played on the engine (toy) has no tasks, tokenizer or model dir
            from swerl.agent import load_tokenizer

            if main:
                tasks = make_tasks(cfg.env.section, max_steps=cfg.rollout.max_turns)
            model_dir = _initial_model_dir(cfg, run_dir) if main else None
            # rank 0 wrote the tiny model (if any) before the others read it; a node that does not see
            # rank 0's run directory gets a copy (a model.path must be on every node)
            model_dir = broadcast_object(model_dir)
            if not cfg.model.path:
                share_directory(model_dir, storage)
            elif not main:  # a shipped model: from this node's cache (rank 0 imported it first)
                model_dir = _initial_model_dir(cfg, run_dir)
            tokenizer = load_tokenizer(cfg.model.tokenizer or (model_dir if cfg.model.path else None))
        total_steps = cfg.steps * cfg.optim.ppo_epochs * cfg.optim.mini_batches
        # the hf engine's own fp32 copy, on rank 0 only; the learner gets a factory: under ZeRO-3 it builds
        # the policy and the reference partitioned over the ranks (bf16 training: loaded in bf16, DeepSpeed
        # keeps the fp32 master weights), else it calls it once
        engine_model = (_load_policy(cfg, model_dir, torch.float32)
                        if main and cfg.rollout.engine == "hf" else None)
        train_dtype = torch.bfloat16 if cfg.learner.bf16 else torch.float32
        learner = make_learner(lambda: _load_policy(cfg, model_dir, train_dtype), cfg.algo, cfg.optim,
                               cfg.learner, device=cfg.device, total_steps=total_steps, storage=storage)
        engine = aio.run(_open_engine(cfg, engine_model, model_dir, run_dir, log)) if main else None
        pad_id = getattr(engine, "pad_token_id", None)
        pad_id = pad_id if pad_id is not None else (tokenizer.pad_token_id if tokenizer is not None else 0)

        # auto-resume from the newest checkpoint complete on every rank's disk
        start = 0
        ckpt = agreed_checkpoint(run_dir)
        if ckpt is not None:
            extra = learner.load_checkpoint(ckpt)  # every rank: its own shard
            task_rng.setstate(extra["task_rng"])
            if "engine_rng" in extra and hasattr(engine, "generator"):
                engine.generator.set_state(extra["engine_rng"])
            start = int(extra["train_step"])
            aio.run(_sync_weights(cfg, engine, learner, tokenizer, run_dir, start))
            if main:
                _truncate_rows(metrics_path, start)
                _truncate_rows(run_dir / "rollouts.jsonl", start)
            if log:
                log(f"resumed from {ckpt} at step {start}")

        rows = []
        tb = TensorBoardWriter(run_dir / "tensorboard") if main and cfg.metrics.tensorboard else None
        wb = (WandbWriter(run_dir, cfg.metrics, to_dict(cfg))
              if main and cfg.metrics.wandb else None)
        try:
            with (TrainDisplay(cfg.steps, start, enabled=cfg.metrics.progress and log is not None,
                               log=log) as ui,
                  _sandbox_pools(cfg, main, log) as pools,
                  _ahead(cfg, aio, engine, _group_player(cfg, tokenizer, tasks, task_rng, run_dir, pools),
                         start, main) as ahead):
                for step in range(start, cfg.steps):
                    t0 = time.perf_counter()
                    # tasks → n rollouts each → rewards (rank 0), shared with every rank; async: the groups
                    # the producer finished ahead, none staler than async.max_staleness
                    ui.phase("rollout")
                    if main and ahead is not None:
                        b = ahead.batch(step + 1)
                        ro = _Rollouts(list(b.trajectories), list(b.groups), list(b.results), 1, b.metrics)
                    else:
                        ro = (_collect(aio, cfg, engine, tokenizer, tasks, task_rng, run_dir, ui, step + 1,
                                       pools) if main else None)
                    trajectories, groups = broadcast_object((ro.trajectories, ro.groups) if ro else None)
                    rollout_s = time.perf_counter() - t0
                    ui.phase("learn")  # advantages → AEM → reference → loss → optimizer steps
                    if len(set(groups)) >= rank.world_size:
                        mine = shard_rows_by_group(groups, rank.rank, rank.world_size,
                                                   lengths=[len(t.token_ids) for t in trajectories])
                        batch = collate([trajectories[i] for i in mine], [groups[i] for i in mine],
                                        pad_id=pad_id)
                        metrics = grouped_update_metrics(dataclasses.asdict(learner.update(batch)))
                    else:  # nothing to learn from (or fewer groups than ranks): say so and go on
                        metrics = {"actor/skipped": True, "reward/mean": math.nan}
                        ui.note(f"step {step + 1}: {len(set(groups))} usable rollout group(s) for "
                                f"{rank.world_size} rank(s): no update; see {run_dir}/rollouts.jsonl")
                    t1 = time.perf_counter()
                    ui.phase("sync")  # async: generation paused around it (async.partial_rollouts)
                    with ahead.weight_update(step + 1) if ahead is not None else contextlib.nullcontext():
                        aio.run(_sync_weights(cfg, engine, learner, tokenizer, run_dir, step + 1))
                    t2 = time.perf_counter()
                    last = step + 1 == cfg.steps
                    val: dict[str, float] = {}
                    if main and cfg.eval_every and (last or (step + 1) % cfg.eval_every == 0):
                        ui.phase("eval")  # the synced engine on the held-out split (async: alone on it)
                        with ahead.quiet() if ahead is not None else contextlib.nullcontext():
                            val = _validate(aio, cfg, engine, tokenizer, run_dir, step + 1, pools)
                    t3 = time.perf_counter()
                    if main:
                        assert ro is not None
                        row = {"train_step": step + 1, **metrics, **_rollout_row(cfg, ro), **ro.metrics,
                               **val, "timing_s/rollout": rollout_s, "timing_s/learn": t1 - t0 - rollout_s,
                               "timing_s/sync": t2 - t1, "timing_s/eval": t3 - t2, "timing_s/step": t3 - t0}
                        _append_jsonl(metrics_path, row)
                        if tb is not None:
                            tb.write(row)
                        if wb is not None:
                            wb.write(row)
                        rows.append(row)
                        ui.step_done(step + 1, _step_line(cfg, row), f"reward {row['reward/mean']:.3f} "
                                     f"success {row['reward/success_rate']:.2f}")
                    if last or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):
                        ui.phase("checkpoint")  # every rank writes its shard; rank 0's loop state goes along
                        extra = {"task_rng": task_rng.getstate(), "train_step": step + 1}
                        if hasattr(engine, "generator"):
                            extra["engine_rng"] = engine.generator.get_state()
                        learner.save_checkpoint(run_dir, step + 1, extra, keep_last=cfg.keep_checkpoints)
                if cfg.export_final:
                    ui.phase("export")
                    learner.export_hf(run_dir / "policy", tokenizer=tokenizer)
        finally:
            if tb is not None:
                tb.close()
            if wb is not None:
                wb.close()
            if engine is not None:
                aio.run(engine.close())
        return rows
