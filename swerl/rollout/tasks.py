"""Task sets for training: which tasks exist, and how one task becomes the episode specs of a group.

The training loop samples task ids, asks the task set for `n` `EpisodeSpec`s per id (one GRPO
group) and hands them all to the runner. A task set owns what is specific to its environment:

- `SWETaskSet`: SWE-bench-schema instances; each episode runs `SWEEnv` in a sandbox of the
  instance's image (built offline from the shipped sources, or pulled), and its reward is SWE-bench's
  own grade: of the submitted patch, or, for an episode cut by a budget before it submitted, of the
  working tree it left (graded in a fresh container while the episode's sandbox is still held).

- `GameTaskSet`: ALFWorld games, WebShop goals or generated puzzles (Sokoban, FrozenLake, Sudoku); each
  episode plays the game through the text-game harness, inside a sandbox of the text-game image (the
  game server driven over its line protocol) or in this process. Reward: the env's running total (win /
  purchase score, minus invalid-action penalties); an episode that never acted validly scores 0.

`TaskSet` is the interface the loop uses.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from swerl.agent import Env
from swerl.rollout.runner import EpisodeSpec
from swerl.structs import GradingConfig, SandboxSpec, SWEInstance, Trajectory


class TaskSet(Protocol):
    """The tasks of one environment kind, for the training loop."""

    ids: tuple[str, ...]
    """Task ids the loop samples from (in a fixed order)."""

    def prepare(self, task_ids: Sequence[str]) -> None:
        """Make the tasks runnable (e.g. build their images) before their episodes start."""
        ...

    def specs(self, task_id: str, group: int, n: int) -> list[EpisodeSpec]:
        """The `n` episodes of one rollout group on `task_id`."""
        ...

    def success(self, trajectory: Trajectory) -> bool:
        """Whether an episode solved its task (resolve / success rate)."""
        ...


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

    def __init__(self, cfg: SWETaskConfig, *, client: Any = None) -> None:
        from swerl.envs.swe.instances import load_instances

        instances = load_instances(cfg.tasks, split=cfg.split or None, instance_ids=cfg.instance_ids or None,
                                   limit=cfg.limit or None)
        if not instances:
            raise ValueError(f"env.swe: no instances in {cfg.tasks!r} with split {cfg.split!r}"
                             f"{' and the given instance_ids' if cfg.instance_ids else ''}: check env.swe.tasks "
                             "and env.swe.split (`swerl tasks list --tasks ...` shows what is there)")
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

    def success(self, trajectory: Trajectory) -> bool:
        return (trajectory.reward or 0.0) >= 1.0


GAME_KINDS_TRAIN = ("alfworld", "webshop", "sokoban", "frozenlake", "sudoku")


@dataclass(frozen=True)
class GameTaskConfig:
    """Text-game tasks for training (config sections `env.alfworld` / `env.webshop`)."""

    data: str = ""
    """Game data: ALFWorld's data folder (generated set or the official json_2.1.1 layout) / the WebShop
    catalog folder; empty: the set shipped under tasks/. Puzzle games (sokoban, frozenlake, sudoku): their
    generator options, `name=value,...` (e.g. `dim=7,boxes=2`); empty: the defaults."""
    split: str = "train"
    """Split to train on (ALFWorld: train / heldout, official: train / valid_seen; WebShop: train / test;
    puzzle games: train / heldout)."""
    limit: int = 0
    """Keep the first N games of the split (0: all)."""
    sandbox: bool = True
    """Play each game inside a sandbox of the text-game image (False: in this process)."""
    win_reward: float = 10.0
    """ALFWorld and the puzzle games: reward for winning (verl-agent: 10). WebShop pays score_scale × purchase
    score instead."""
    score_scale: float = 10.0
    """WebShop: reward per unit of purchase score."""
    invalid_penalty: float = 0.1
    """Subtracted for each action that is not admissible."""

    def __post_init__(self) -> None:
        if self.limit < 0 or self.invalid_penalty < 0 or self.score_scale < 0:
            raise ValueError("env.<game>.limit, invalid_penalty and score_scale must be >= 0")


class GameTaskSet:
    """ALFWorld games / WebShop goals / puzzles as training tasks (see the module docstring). `max_steps` is
    the episode's turn budget (the loop's rollout.max_turns)."""

    def __init__(self, kind: str, cfg: GameTaskConfig, *, max_steps: int) -> None:
        if kind == "alfworld":
            from swerl.envs import alfworld, alfworld_env

            ids = alfworld.list_games(cfg.data or None, cfg.split)
            opts = alfworld_env.eval_options(cfg.data or None)
        elif kind == "webshop":
            from swerl.envs.webshop import env as webshop_env

            ids = webshop_env.list_games(cfg.data or None, cfg.split)
            opts = webshop_env.eval_options(cfg.data or None, score_scale=cfg.score_scale)
        elif kind in GAME_KINDS_TRAIN:
            from swerl.envs.games import env as puzzle_env

            ids = puzzle_env.list_games(kind, cfg.data or None, cfg.split)
            opts = puzzle_env.eval_options(kind, cfg.data or None)
        else:
            raise ValueError(f"no text game {kind!r}: one of {GAME_KINDS_TRAIN}")
        ids = ids[:cfg.limit] if cfg.limit else ids
        if not ids:
            raise ValueError(f"env.{kind}: no games in split {cfg.split!r} of {cfg.data or 'the shipped set'}")
        self.kind, self.cfg = kind, cfg
        self.ids = tuple(ids)
        self.game_kwargs: dict[str, Any] = opts["game_kwargs"]
        self.prompt = opts["prompt"]
        self.make_env = opts["make_env"]
        self.config = dataclasses.replace(opts["config"], invalid_penalty=cfg.invalid_penalty, max_steps=max_steps,
                                          **({"win_reward": cfg.win_reward} if kind != "webshop" else {}))
        self._image: str | None = None
        self._lock = threading.Lock()

    def prepare(self, task_ids: Sequence[str]) -> None:
        if self.cfg.sandbox:
            from swerl.envs.textgame import build_textgame_image

            with self._lock:
                if self._image is None:
                    self._image = build_textgame_image()

    @property
    def image(self) -> str | None:
        """The text-game image the games run in (after `prepare`); None: they run in this process."""
        return self._image

    def specs(self, task_id: str, group: int, n: int) -> list[EpisodeSpec]:
        from swerl.envs.textgame import open_game

        self.prepare([task_id])
        kind, kwargs, prompt, config, env_cls = self.kind, self.game_kwargs, self.prompt, self.config, self.make_env

        def make_env(sb: Any) -> Env:
            return env_cls(open_game(kind, sb, **kwargs), task_id, prompt, config)

        sandbox = SandboxSpec(image=self._image) if self._image else None
        return [EpisodeSpec(task_id=task_id, group=group, sample=s, make_env=make_env, sandbox=sandbox,
                            finish=_score_unacted) for s in range(n)]

    def success(self, trajectory: Trajectory) -> bool:
        return trajectory.stop_reason == "won"


def _score_unacted(env: Any, trajectory: Trajectory) -> Trajectory:
    """An episode that never acted validly (every turn malformed) has no env reward yet: it scores 0.
    (The runner closes the game, finished or failed, through `TextGameEnv.close`.)"""
    return trajectory if trajectory.reward is not None else dataclasses.replace(trajectory, reward=0.0)


def _grade_unsubmitted(env: Any, trajectory: Trajectory) -> Trajectory:
    """A submitted episode was graded when it submitted; one cut by a budget is graded on the diff it
    left in the working tree (as SWE-bench grades whatever patch exists); an empty diff scores 0
    without a grading run (SWE-bench does not run empty patches). The grade's tampered files go along."""
    if trajectory.reward is not None:
        grade = env.last_grade
    elif not env.sandbox.diff().strip():
        return dataclasses.replace(trajectory, reward=0.0)
    else:
        grade = env.grade(trajectory)
        trajectory = dataclasses.replace(trajectory, reward=float(grade.reward))
    tampered = tuple(grade.tampered_files) if grade is not None else ()
    return dataclasses.replace(trajectory, tampered_files=tampered) if tampered else trajectory
