"""`TrainConfig`, the one config tree of `swerl train`, composed of its owners' sections (model, rollout,
algo, optim, learner, metrics, async, env, eval), and `check_resume`, which refuses to continue a run
directory that holds another experiment. Read by `swerl.train`; nothing here runs a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from swerl.asyncrl import AsyncConfig, check_engine
from swerl.cluster.config import ClusterConfig
from swerl.config import ConfigError, to_dict
from swerl.envs.registry import EnvKind, env_kind
from swerl.envs.swe.tasks import SWETaskConfig
from swerl.envs.textgame.tasks import GameTaskConfig
from swerl.envs.toy import ToyEnvConfig
from swerl.learner.checkpoint import latest_checkpoint
from swerl.learner.config import AlgoConfig, LearnerConfig, OptimConfig
from swerl.models import ModelConfig
from swerl.rollout.config import RolloutConfig
from swerl.runlog import MetricsConfig


@dataclass(frozen=True)
class EnvConfig:
    """Which environment the tasks come from."""

    kind: str = "toy"
    """Environment kind: swe (SWE-bench-schema tasks in sandboxes), alfworld, webshop, sokoban, frozenlake,
    sudoku (text games, in sandboxes or in process) or toy (synthetic game for tests)."""
    toy: ToyEnvConfig = field(default_factory=ToyEnvConfig)
    """The toy game's size (kind toy)."""
    swe: SWETaskConfig = field(default_factory=SWETaskConfig)
    """The SWE tasks (kind swe)."""
    alfworld: GameTaskConfig = field(default_factory=GameTaskConfig)
    """The ALFWorld games (kind alfworld; rollout.max_turns is the step budget, verl-agent: 50)."""
    webshop: GameTaskConfig = field(default_factory=GameTaskConfig)
    """The WebShop goals (kind webshop; rollout.max_turns is the step budget, verl-agent: 15)."""
    sokoban: GameTaskConfig = field(default_factory=GameTaskConfig)
    """The Sokoban rooms (kind sokoban; `data` takes generator options, e.g. dim=7,boxes=2)."""
    frozenlake: GameTaskConfig = field(default_factory=GameTaskConfig)
    """The FrozenLake maps (kind frozenlake; gymnasium's FrozenLake-v1, not slippery unless slippery=true)."""
    sudoku: GameTaskConfig = field(default_factory=GameTaskConfig)
    """The Sudoku puzzles (kind sudoku; 4×4 unless size=N)."""

    def __post_init__(self) -> None:
        env_kind(self.kind)  # an unknown kind: the error lists the registry's kinds

    @property
    def spec(self) -> EnvKind:
        """The registry's entry of `kind`."""
        return env_kind(self.kind)

    @property
    def section(self) -> Any:
        """The config section of `kind` (`env.<kind>`)."""
        return getattr(self, self.kind)


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation during training (`eval_every`): the held-out split through the code `swerl eval` runs."""

    split: str = ""
    """Split evaluated; empty: the env's held-out split (swe: heldout, alfworld: heldout, webshop: test;
    toy: every cue)."""
    limit: int = 0
    """Evaluate the first N tasks of the split (0: all)."""
    k: int = 1
    """Episodes per task (pass@1..k is reported)."""
    seed: int = 1234
    """hf engine: the sampling seed of every evaluation (the same each time, so steps compare on the same
    random numbers; training's own sampling stream is set aside and restored)."""
    temperature: float = 1.0
    """Sampling temperature of the evaluation episodes (pass@k > 1 needs sampling)."""

    def __post_init__(self) -> None:
        if self.limit < 0 or self.k < 1:
            raise ValueError(f"eval.limit must be >= 0 and eval.k >= 1, got {self.limit}, {self.k}")
        if self.temperature < 0:
            raise ValueError(f"eval.temperature must be >= 0, got {self.temperature}")


RESUME_KEYS = ("model", "env", "algo", "learner.lora")
"""Config sections a run directory's checkpoints depend on: resuming with any of them changed is refused
(the checkpoint holds another model, or the run would mix two experiments)."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run."""

    run_dir: str = "runs/debug"
    """Directory for metrics.jsonl, rollouts.jsonl, config.yaml, checkpoints/ and the exported policy;
    resumed if it holds checkpoints."""
    steps: int = 30
    """Training steps (one batch of rollouts and one learner update each)."""
    group_size: int = 8
    """Rollouts per task (GRPO group size n). Failed episodes (sandbox, grading, engine faults) are left
    out of their group, never scored 0; a group trains on the rest when at least 2 remain (1 for
    reinforce), else it is dropped."""
    batch_episodes: int = 64
    """Episodes per step; must be whole groups (a multiple of group_size): tasks per step =
    batch_episodes / group_size."""
    dapo_max_rounds: int = 3
    """With algo.dapo_filter: rounds of sampling fresh tasks to replace groups whose rewards are all
    equal before the step trains on what it has (the learner then drops the rest)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many steps (and at the last step); 0: only at the last step."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept; 0 keeps all."""
    export_final: bool = True
    """Write the final policy in HF format (with its tokenizer) to <run_dir>/policy."""
    seed: int = 0
    """Seed of task sampling and of torch."""
    eval_every: int = 0
    """Evaluate the policy on the held-out split (section `eval`) every this many steps, and after the
    last step; `val/` metrics. 0: never."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training (`eval_every`)."""
    device: str = "cpu"
    """Device of the learner."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The initial policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout engine and the episode budgets."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages, DAPO, AEM, ActFocus, KL, clipping."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer, LR schedule, PPO epochs / mini-batches, micro-batching."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Learner backend: plain torch or DeepSpeed ZeRO (launch with torchrun or the deepspeed launcher),
    LoRA."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Metrics outputs and the progress display."""
    async_: AsyncConfig = field(default_factory=AsyncConfig, metadata={"key": "async"})
    """Rollouts overlapped with learning: bounded staleness, partial rollouts (YAML key `async`)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where episodes and sandboxes run: this machine (`local`) or a Ray cluster's sandbox hosts (`ray`)."""

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
        if (self.checkpoint_every < 0 or self.keep_checkpoints < 0 or self.dapo_max_rounds < 0
                or self.eval_every < 0):
            raise ValueError("checkpoint_every, keep_checkpoints, dapo_max_rounds and eval_every "
                             "must be >= 0")
        if self.env.spec.engine_game is not None and (self.model.path or self.rollout.engine != "hf"):
            raise ValueError(f"env.kind {self.env.kind} uses its own tiny vocabulary and the hf engine: "
                             "leave model.path empty and rollout.engine hf")
        check_engine(self.async_, self.rollout.engine)
        if self.cluster.enabled and self.env.spec.task_set is None:
            raise ValueError(f"env.kind {self.env.kind} plays on the engine, with no sandboxes to spread: "
                             "set cluster.backend=local")
        if self.cluster.enabled and self.cluster.generation == "direct" and self.rollout.engine == "hf":
            raise ValueError("cluster.generation=direct needs inference servers (rollout.engine sglang or "
                             "vllm): the hf engine lives in the driver — use cluster.generation=auto or "
                             "bridge")
        if self.cluster.enabled and self.async_.enabled:
            raise ValueError("cluster.backend=ray runs the synchronous loop only for now: set "
                             "async.max_staleness=0, or cluster.backend=local")

    @property
    def tasks_per_step(self) -> int:
        return self.batch_episodes // self.group_size


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume(cfg: TrainConfig, *, force: bool = False) -> None:
    """Refuse, before anything is written, to continue a run directory that holds another experiment:
    one whose saved config.yaml differs from `cfg` in a `RESUME_KEYS` section (another model, tokenizer,
    env or algorithm). Budgets, logging, optimiser and schedule settings may change on resume."""
    run_dir = Path(cfg.run_dir)
    saved_path = run_dir / "config.yaml"
    if force or not saved_path.is_file():
        return
    if latest_checkpoint(run_dir) is None and not (run_dir / "metrics.jsonl").is_file():
        return  # the earlier run never finished a step: nothing to mix with
    try:
        saved = _flatten(yaml.safe_load(saved_path.read_text()) or {})
    except yaml.YAMLError as e:
        raise ConfigError(f"{saved_path} is not valid YAML ({e}) — pick another run_dir, or pass "
                          "--force-resume to overwrite it") from e
    new = _flatten(yaml.safe_load(yaml.safe_dump(to_dict(cfg))))

    def guarded(key: str) -> bool:
        return any(key == g or key.startswith(g + ".") for g in RESUME_KEYS)

    # keys one side lacks are a swerl version adding or dropping a field, not a changed experiment
    changed = [k for k in sorted(saved) if guarded(k) and k in new and saved[k] != new[k]]
    if changed:
        diffs = "; ".join(f"{k}: {saved[k]!r} → {new[k]!r}" for k in changed)
        raise ConfigError(f"{run_dir} holds a run with a different {', '.join(changed)} ({diffs}) — pick "
                          "another run_dir, or pass --force-resume to continue this one anyway")
