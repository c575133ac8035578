"""THE training loop, top to bottom: `train(cfg)`.

    sample tasks → n rollouts per task on the rollout engine → rewards → learner update
    → weight sync to the rollout engine → metrics row to <run_dir>/metrics.jsonl
    → checkpoint every `checkpoint_every` steps; a run directory with checkpoints is resumed.

Configuration is one `TrainConfig` tree (YAML + dotted overrides via `swerl.config.load`). Every
method is a switch under `algo`; all off is plain GRPO.

Environments: `env.kind: toy` (the synthetic multi-turn game of `swerl.learner.toy`, driven straight
on the engine) is what this loop runs today. The SWE / text-game envs go through
`swerl.rollout.run_episodes` (EpisodeSpec per (task, sample)) at the marked seam in `_rollouts`.
Nothing imports this module except the CLI.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from swerl.learner import AlgoConfig, Learner, OptimConfig, collate
from swerl.learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from swerl.learner.metrics import MetricsConfig, TensorBoardWriter
from swerl.learner.toy import ToyEnvConfig, make_toy_model, sample_cues, toy_rollouts
from swerl.structs import Trajectory

ENV_KINDS = ("toy",)


@dataclass(frozen=True)
class ModelConfig:
    """The policy's initial weights."""

    path: str = ""
    """HF checkpoint directory of the initial policy; empty: a random-init tiny model (toy env only)."""
    hidden_size: int = 64
    """Tiny model (path empty): hidden size."""
    num_layers: int = 2
    """Tiny model: transformer layers."""
    num_heads: int = 4
    """Tiny model: attention heads."""
    num_kv_heads: int = 2
    """Tiny model: key/value heads."""
    intermediate_size: int = 128
    """Tiny model: MLP width."""
    seed: int = 0
    """Tiny model: initialisation seed."""


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout engine (in-process HF today; SGLang / vLLM servers take `update_weights(dir)`)."""

    engine: str = "hf"
    """Engine kind: hf."""
    max_batch: int = 64
    """Requests the HF engine decodes together."""
    seed: int = 0
    """Sampling seed of the engine."""

    def __post_init__(self) -> None:
        if self.engine != "hf":
            raise ValueError(f"rollout.engine must be 'hf' (sglang/vllm arrive later), got {self.engine!r}")
        if self.max_batch < 1:
            raise ValueError(f"rollout.max_batch must be >= 1, got {self.max_batch}")


@dataclass(frozen=True)
class EnvConfig:
    """Which environment the tasks come from."""

    kind: str = "toy"
    """Environment kind: toy (synthetic multi-turn game for tests and debugging)."""
    toy: ToyEnvConfig = field(default_factory=ToyEnvConfig)
    """The toy game's size."""

    def __post_init__(self) -> None:
        if self.kind not in ENV_KINDS:
            raise ValueError(f"env.kind must be one of {ENV_KINDS} (swe/alfworld training is not wired "
                             f"into the loop yet), got {self.kind!r}")


@dataclass(frozen=True)
class TrainConfig:
    """One training run."""

    run_dir: str = "runs/debug"
    """Directory for metrics.jsonl, config.yaml, checkpoints/ and the exported policy; resumed if it
    holds checkpoints."""
    steps: int = 30
    """Training steps (one learner update each)."""
    group_size: int = 8
    """Rollouts per task (GRPO group size n)."""
    batch_episodes: int = 64
    """Episodes per step; must be whole groups (a multiple of group_size): tasks per step =
    batch_episodes / group_size."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many steps (and at the last step); 0: only at the last step."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept; 0 keeps all."""
    export_final: bool = True
    """Write the final policy in HF format to <run_dir>/policy."""
    seed: int = 0
    """Seed of task sampling and of torch."""
    device: str = "cpu"
    """Device of the learner."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The initial policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout engine."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages, DAPO, AEM, ActFocus, KL, clipping."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and micro-batching."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Metrics outputs: <run_dir>/metrics.jsonl always, TensorBoard optionally."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.group_size < 2 and self.algo.estimator != "reinforce":
            raise ValueError(f"group_size {self.group_size} gives every episode advantage 0 under the "
                             f"{self.algo.estimator!r} estimator (a group needs >= 2 rollouts)")
        if self.batch_episodes < 1 or self.batch_episodes % self.group_size:
            raise ValueError(f"batch_episodes {self.batch_episodes} is not a whole number of groups of "
                             f"group_size {self.group_size}: use a positive multiple of {self.group_size}")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 0:
            raise ValueError("checkpoint_every and keep_checkpoints must be >= 0")
        if self.env.kind == "toy" and self.model.path:
            raise ValueError("env.kind toy uses its own tiny vocabulary: leave model.path empty")

    @property
    def tasks_per_step(self) -> int:
        return self.batch_episodes // self.group_size


def _build_policy(cfg: TrainConfig) -> Any:
    m = cfg.model
    if m.path:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(m.path, dtype=torch.float32)
    return make_toy_model(cfg.env.toy.vocab_size, hidden_size=m.hidden_size, num_layers=m.num_layers,
                          num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                          intermediate_size=m.intermediate_size, seed=m.seed)


def _rollouts(cfg: TrainConfig, engine: Any, task_rng: random.Random) -> tuple[list[Trajectory], list[int]]:
    """Sample tasks, run `group_size` episodes of each; returns rewarded trajectories and group labels."""
    if cfg.env.kind == "toy":
        cues = sample_cues(task_rng, cfg.env.toy, cfg.tasks_per_step)
        return asyncio.run(toy_rollouts(engine, cfg.env.toy, cues, cfg.group_size,
                                        temperature=cfg.algo.temperature))
    # seam: other envs build EpisodeSpecs (task, group, sample, make_env) and call
    # swerl.rollout.run_episodes(specs, engine, tokenizer, ...); failed episodes (trajectory None)
    # are dropped; rewards come from the env / grader.
    raise NotImplementedError(f"env.kind {cfg.env.kind!r}")


def _append_jsonl(path: Path, row: dict[str, Any]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    with open(path, "a") as f:
        f.write(json.dumps(clean) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows past the resumed step (written after the checkpoint the run resumes from)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["train_step"] <= last_step:
                keep.append(line)
        except (ValueError, KeyError):
            continue  # a torn last line
    path.write_text("".join(line + "\n" for line in keep))


def train(cfg: TrainConfig, *, log: Callable[[str], None] | None = print) -> list[dict[str, Any]]:
    """Run (or resume) a training run; returns the metrics rows of the steps run in this call."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    metrics_path = run_dir / "metrics.jsonl"
    torch.manual_seed(cfg.seed)
    task_rng = random.Random(cfg.seed)

    # models: the learner trains `policy`; the engine samples from its own copy, synced every step
    from swerl.rollout.hf import HFEngine

    policy = _build_policy(cfg)
    engine = HFEngine(copy.deepcopy(policy), seed=cfg.rollout.seed, max_batch=cfg.rollout.max_batch,
                      batch_window_s=0.0)
    learner = Learner(policy, cfg.algo, cfg.optim, device=cfg.device)

    # auto-resume from the newest complete checkpoint of the run directory
    start = 0
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt)
        learner.load_state_dict(state["learner"])
        task_rng.setstate(state["task_rng"])
        engine.generator.set_state(state["engine_rng"])
        asyncio.run(engine.update_weights(learner.policy_state_dict()))
        start = int(state["train_step"])
        _truncate_metrics(metrics_path, start)
        if log:
            log(f"resumed from {ckpt} at step {start}")

    rows = []
    tb = TensorBoardWriter(run_dir / "tensorboard") if cfg.metrics.tensorboard else None
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            trajectories, groups = _rollouts(cfg, engine, task_rng)  # tasks → n rollouts each → rewards
            rollout_s = time.perf_counter() - t0
            batch = collate(trajectories, groups, pad_id=engine.pad_token_id)
            metrics = learner.update(batch)  # advantages → AEM → reference → loss → step
            t1 = time.perf_counter()
            asyncio.run(engine.update_weights(learner.policy_state_dict()))  # weight sync
            sync_s = time.perf_counter() - t1
            row = {"train_step": step + 1, **dataclasses.asdict(metrics), "rollout_s": rollout_s,
                   "sync_s": sync_s, "step_s": time.perf_counter() - t0,
                   "turns_mean": sum(t.num_turns for t in trajectories) / len(trajectories),
                   "seq_len_mean": sum(len(t.token_ids) for t in trajectories) / len(trajectories)}
            _append_jsonl(metrics_path, row)
            if tb is not None:
                tb.write(row)
            rows.append(row)
            if log:
                log(f"step {step + 1}/{cfg.steps} reward {metrics.reward_mean:.3f} loss {metrics.loss:+.4f} "
                    f"entropy {metrics.entropy:.3f} grad_norm {metrics.grad_norm:.3f} "
                    f"({row['step_s']:.2f}s)")
            last = step + 1 == cfg.steps
            if last or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):
                state = {"learner": learner.state_dict(), "task_rng": task_rng.getstate(),
                         "engine_rng": engine.generator.get_state(), "train_step": step + 1}
                save_checkpoint(run_dir, step + 1, state, keep_last=cfg.keep_checkpoints)
        if cfg.export_final:
            learner.export_hf(run_dir / "policy")
    finally:
        if tb is not None:
            tb.close()
        asyncio.run(engine.close())
    return rows
