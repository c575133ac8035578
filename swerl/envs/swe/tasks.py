"""SWE tasks for training: SWE-bench-schema instances, each episode running `SWEEnv` in a sandbox of the
instance's image (built offline from the shipped sources, or pulled). Its reward is SWE-bench's own
grade: of the submitted patch, or, for an episode cut by a budget before it submitted, of the working
tree it left (graded in a fresh container while the episode's sandbox is still held)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swerl.agent.env import Env, EpisodeSpec
from swerl.envs.swe.types import GradingConfig, SWEInstance
from swerl.structs import SandboxSpec, Trajectory


@dataclass(frozen=True)
class SWETaskConfig:
    """SWE tasks for training (config section `env.swe`)."""

    tasks: str = "tasks/swe"
    """Instances: a local .json/.jsonl/.parquet file, a folder with instances.jsonl, or a hub dataset
    id (e.g. SWE-bench/SWE-bench_Verified) when the hub is reachable."""
    split: str = "train"
    """Keep the records of this split (local files: their `split` field; hub: the dataset split)."""
    instance_ids: tuple[str, ...] = ()
    """Keep exactly these instances (empty: all of the split)."""
    limit: int = 0
    """Keep the first N instances (0: all)."""
    sandbox_memory: str = "2g"
    """Memory limit of an agent's sandbox."""
    sandbox_cpus: float = 1.0
    """CPU limit of an agent's sandbox."""
    grading_timeout_s: float = 1800.0
    """Seconds the grading run of one patch may take (SWE-bench's harness default)."""
    partial_reward: bool = False
    """Reward the fraction of FAIL_TO_PASS tests fixed (when no PASS_TO_PASS test breaks) instead of 0/1."""

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"env.swe.limit must be >= 0, got {self.limit}")
        if self.grading_timeout_s <= 0:
            raise ValueError(f"env.swe.grading_timeout_s must be > 0, got {self.grading_timeout_s}")


class SWETaskSet:
    """SWE-bench-schema instances as training tasks (see the module docstring)."""

    def __init__(self, cfg: SWETaskConfig, *, client: Any = None,
                 instances: Sequence[SWEInstance] | None = None) -> None:
        """`instances`: the instances themselves (`swerl eval model` selects them with its own flags), instead
        of those `cfg.tasks` / `split` / `instance_ids` / `limit` name; `cfg` still gives the sandbox and
        grading settings."""
        from swerl.envs.swe.instances import InstanceError, load_instances

        if instances is None:
            instances = load_instances(cfg.tasks, split=cfg.split or None,
                                       instance_ids=cfg.instance_ids or None, limit=cfg.limit or None)
        elif len({i.instance_id for i in instances}) != len(instances):
            raise InstanceError("the task set names an instance twice")
        if not instances:
            raise ValueError(f"env.swe: no instances in {cfg.tasks!r} with split {cfg.split!r}"
                             f"{' and the given instance_ids' if cfg.instance_ids else ''}: check "
                             "env.swe.tasks and env.swe.split (`swerl tasks list --tasks ...` shows what is "
                             "there)")
        self.cfg = cfg
        self.instances: dict[str, SWEInstance] = {i.instance_id: i for i in instances}
        self.ids = tuple(self.instances)
        self.grading = GradingConfig(timeout_s=cfg.grading_timeout_s, partial_reward=cfg.partial_reward)
        self._client = client
        self._images: dict[str, str] = {}
        self._lock = threading.Lock()

    def image(self, task_id: str) -> str:
        """The instance's image, built or found once and remembered."""
        from swerl.envs.swe.images import resolve_image

        with self._lock:
            if task_id not in self._images:
                self._images[task_id] = resolve_image(self.instances[task_id], client=self._client)
            return self._images[task_id]

    def prepare(self, task_ids: Sequence[str]) -> None:
        for task_id in dict.fromkeys(task_ids):
            self.image(task_id)

    def specs(self, task_id: str, group: int, n: int) -> list[EpisodeSpec]:
        from swerl.envs.swe.env import SWEEnv

        inst = self.instances[task_id]
        image = self.image(task_id)
        sandbox = SandboxSpec(image=image, memory=self.cfg.sandbox_memory, cpus=self.cfg.sandbox_cpus)
        grading = self.grading

        def make_env(sb: Any) -> Env:
            return SWEEnv(sb, inst, grading=grading, image=image)

        return [EpisodeSpec(task_id=task_id, group=group, sample=s, make_env=make_env, sandbox=sandbox,
                            finish=_grade_unsubmitted) for s in range(n)]


def swe_success(trajectory: Trajectory) -> bool:
    """Resolved: the full reward (a partial reward is progress, not a resolve)."""
    return (trajectory.reward or 0.0) >= 1.0


def _grade_unsubmitted(env: Any, trajectory: Trajectory) -> Trajectory:
    """The finish hook of every SWE episode (training and evaluation): a submitted episode was graded
    when it submitted; one cut by a budget is graded now, on the tree it left (`SWEEnv.grade`, while the
    episode's sandbox is still held). The grade's tampered files and evidence go along."""
    grade = env.grade(trajectory)
    if trajectory.reward is None:
        trajectory = dataclasses.replace(trajectory, reward=float(grade.reward))
    if grade.tampered_files or grade.tampered:
        trajectory = dataclasses.replace(trajectory, tampered_files=tuple(grade.tampered_files),
                                         tampered=grade.tampered)
    return trajectory
