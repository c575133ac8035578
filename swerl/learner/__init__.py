"""The learner: batching of trajectories, policy + frozen reference on plain torch (`Learner`) or on
DeepSpeed ZeRO 0–3 (`swerl.learner.ds_learner`, imported only when asked for), LoRA
(`swerl.learner.lora`), the update step, checkpoints and HF export; `make_learner` picks by config,
`swerl.learner.dist` holds the process-group helpers.

May import `swerl.algo`, `swerl.structs`, torch and (lazily, for ZeRO-3 construction and LoRA merges)
transformers; never the rollout side or the training loop. (The toy env the tests train on is
`swerl.envs.toy`; its model is `swerl.models.make_toy_model`.)
"""

from swerl.learner.backend import loss_positions, shared_prefix
from swerl.learner.batch import Batch, collate, pack_micro_batches
from swerl.learner.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from swerl.learner.config import (
    ActFocusConfig,
    AEMConfig,
    AlgoConfig,
    KLConfig,
    LearnerConfig,
    LoRAConfig,
    OptimConfig,
    OverlongConfig,
    RolloutISConfig,
)
from swerl.learner.factory import make_learner
from swerl.learner.learner import Learner, sequence_stats

__all__ = [
    "AEMConfig",
    "ActFocusConfig",
    "AlgoConfig",
    "Batch",
    "KLConfig",
    "Learner",
    "LearnerConfig",
    "LoRAConfig",
    "OptimConfig",
    "OverlongConfig",
    "RolloutISConfig",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "loss_positions",
    "make_learner",
    "pack_micro_batches",
    "save_checkpoint",
    "sequence_stats",
    "shared_prefix",
]
