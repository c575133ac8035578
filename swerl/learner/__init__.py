"""The learner: batching of trajectories, policy + frozen reference on plain torch (DeepSpeed later,
see `Learner`'s seam), the update step, checkpoints and HF export.

May import `swerl.algo`, `swerl.structs` and torch (transformers only for the toy model); never the
rollout side or the training loop. `swerl.learner.toy` is a synthetic test/debug environment.
"""

from swerl.learner.batch import Batch, collate, pack_micro_batches
from swerl.learner.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from swerl.learner.config import ActFocusConfig, AEMConfig, AlgoConfig, KLConfig, OptimConfig, OverlongConfig
from swerl.learner.learner import Learner, sequence_stats

__all__ = [
    "AEMConfig",
    "ActFocusConfig",
    "AlgoConfig",
    "Batch",
    "KLConfig",
    "Learner",
    "OptimConfig",
    "OverlongConfig",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "pack_micro_batches",
    "save_checkpoint",
    "sequence_stats",
]
