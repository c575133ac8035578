"""The toy env: a synthetic token game for tests and debug runs (`swerl.envs.toy.game`)."""

from swerl.envs.toy.game import (
    BOS,
    WRONG,
    ToyEnvConfig,
    sample_cues,
    toy_episode,
    toy_rollouts,
    toy_step,
    toy_success,
)

__all__ = ["BOS", "WRONG", "ToyEnvConfig", "sample_cues", "toy_episode", "toy_rollouts", "toy_step",
           "toy_success"]
