"""Config sections of the learner: the algorithm switches and the optimizer. Typed, frozen
dataclasses whose field docstrings are the help text (`swerl.config`); each checks its invariants.

Every method is a switch: with `dapo_filter`, `overlong.enabled`, `aem.enabled`, `actfocus.enabled`
off and `kl.coef` 0, an update is plain GRPO (estimator `grpo`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from swerl.algo import AGG_MODES, ESTIMATORS, IS_LEVELS, IS_MODES, KL_KINDS

LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class OverlongConfig:
    """DAPO soft overlong punishment (added to the episode reward before advantages)."""

    enabled: bool = False
    """Subtract a penalty from the reward of episodes whose generated length enters the buffer."""
    max_len: int = 4096
    """Generated tokens at which the penalty reaches `factor`."""
    buffer_len: int = 1024
    """Length of the soft buffer before max_len where the penalty grows linearly from 0."""
    factor: float = 1.0
    """Penalty at max_len."""

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"overlong.max_len must be >= 1, got {self.max_len}")
        if not 0 < self.buffer_len <= self.max_len:
            raise ValueError(f"overlong.buffer_len must be in (0, max_len={self.max_len}], got "
                             f"{self.buffer_len}")
        if self.factor < 0:
            raise ValueError(f"overlong.factor must be >= 0, got {self.factor}")


@dataclass(frozen=True)
class AEMConfig:
    """Adaptive Entropy Modulation (arXiv 2605.00425): scale each turn's advantage by α(entropy)."""

    enabled: bool = False
    """Rescale advantages per response (agent turn) by α = exp(−λ·H̃) / group mean."""
    lam: float = 1.0
    """Temperature λ; 0 makes every α 1, larger favours confident (low-entropy) turns."""


@dataclass(frozen=True)
class RolloutISConfig:
    """Importance weights between the engine that sampled the tokens and the learner
    (swerl.algo.offpolicy)."""

    mode: str = "off"
    """off, truncate (TIS: each token's policy-gradient term × min(π_old/μ, cap)) or mask (MIS: × π_old/μ
    where it lies in [lower, cap], else the token is dropped); μ is the engine's probability of the token,
    π_old the learner's (needs recompute_old_logp)."""
    level: str = "token"
    """The ratio per token, per sequence (the product over its tokens) or geometric (their geometric mean)."""
    cap: float = 2.0
    """Upper bound of the ratio (>= 1)."""
    lower: float = 0.0
    """Lower bound of the mask mode; 0 means 1 / cap."""

    def __post_init__(self) -> None:
        if self.mode not in ("off", *IS_MODES):
            raise ValueError(f"rollout_is.mode must be off, truncate or mask, got {self.mode!r}")
        if self.level not in IS_LEVELS:
            raise ValueError(f"rollout_is.level must be one of {', '.join(IS_LEVELS)}, got {self.level!r}")
        if not self.cap >= 1:
            raise ValueError(f"rollout_is.cap must be >= 1, got {self.cap}")
        if not 0 <= self.lower <= 1:
            raise ValueError(f"rollout_is.lower must be in [0, 1] (0: 1 / cap), got {self.lower}")


@dataclass(frozen=True)
class ActFocusConfig:
    """ActFocus (arXiv 2605.14558): per-token loss weights from reference-model energy."""

    enabled: bool = False
    """Weight reasoning tokens by alpha and action tokens by 1 + β·sigmoid(normalised energy)."""
    alpha: float = 0.3
    """Weight of reasoning tokens (paper: 0.1 Sokoban, 0.3 WebShop)."""
    beta: float = 0.5
    """Extra weight of uncertain (high-energy) action tokens; keep moderate."""
    measure: bool = False
    """Run the frozen reference's energy pass and log the energy–reward-variance diagnostic
    (actfocus/energy_*) even when ActFocus is off, at the cost of one more forward pass per step; on
    whenever ActFocus is."""

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"actfocus.alpha and actfocus.beta must be >= 0, got {self.alpha}, {self.beta}")


@dataclass(frozen=True)
class KLConfig:
    """KL(π‖π_ref) penalty in the loss."""

    coef: float = 0.0
    """Weight of the KL term; 0 turns it off (no reference pass unless ActFocus needs one)."""
    kind: str = "k3"
    """Estimator: k1, k2 or k3 (verl's low_var_kl)."""

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"kl.coef must be >= 0, got {self.coef}")
        if self.kind not in KL_KINDS:
            raise ValueError(f"kl.kind must be one of {KL_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class AlgoConfig:
    """How rewards become a loss: estimator, DAPO shaping, AEM, ActFocus, KL, clipping."""

    estimator: str = "grpo"
    """Group advantage estimator: grpo, drgrpo, rloo or reinforce."""
    dapo_filter: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal before the update."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """DAPO overlong reward shaping."""
    aem: AEMConfig = field(default_factory=AEMConfig)
    """Adaptive Entropy Modulation of advantages."""
    actfocus: ActFocusConfig = field(default_factory=ActFocusConfig)
    """ActFocus token weights."""
    kl: KLConfig = field(default_factory=KLConfig)
    """KL penalty against the frozen reference model."""
    clip_low: float = 0.2
    """PPO clip range below 1: ratios under 1 − clip_low are clipped (A < 0)."""
    clip_high: float = 0.2
    """PPO clip range above 1 (DAPO's clip-higher: 0.28)."""
    dual_clip: float | None = 3.0
    """Dual-clip constant c > 1 for negative advantages; null disables it."""
    loss_agg: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; the learner's log-probs use the same."""
    recompute_old_logp: bool = False
    """Take the ratio's old log-probs from a learner forward before the first optimizer step (verl's
    default) instead of the engine's sampling log-probs: needed when the engine runs another precision
    or kernel (SGLang / vLLM in bf16); the in-process HF engine matches the learner already."""

    rollout_is: RolloutISConfig = field(default_factory=RolloutISConfig)
    """Importance-sampling correction of the engine/learner mismatch (off by default)."""

    def __post_init__(self) -> None:
        if self.rollout_is.mode != "off" and not self.recompute_old_logp:
            raise ValueError("rollout_is needs recompute_old_logp: true (its ratio is the learner's over the "
                             "engine's log-probs)")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.loss_agg not in AGG_MODES:
            raise ValueError(f"loss_agg must be one of {AGG_MODES}, got {self.loss_agg!r}")
        if not 0 <= self.clip_low < 1:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 or null, got {self.dual_clip}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def needs_reference(self) -> bool:
        """A frozen reference model is kept (KL or ActFocus is on)."""
        return self.kl.coef > 0 or self.actfocus.enabled or self.actfocus.measure


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and memory knobs of the learner."""

    lr: float = 1e-6
    """AdamW peak learning rate (reached after warmup; the schedule shapes it from there)."""
    lr_schedule: str = "constant"
    """After warmup: constant, cosine (down to min_lr_ratio·lr at the last optimizer step) or linear."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from 0 to lr."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine / linear decay as a fraction of lr."""
    ppo_epochs: int = 1
    """Passes over each batch of rollouts (PPO epochs); >1 reuses the rollouts, with clipping."""
    mini_batches: int = 1
    """Optimizer steps per epoch: the kept episodes are shuffled and split into this many mini-batches."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (HF gradient checkpointing): less memory, ~30% more compute."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this; 0 disables clipping (the norm is still reported)."""
    micro_batch_tokens: int = 16384
    """Token budget of one micro-batch (rows × padded length); a longer sequence gets its own."""
    chunk_size: int = 1024
    """Tokens per chunk of the LM-head statistics (no full logits are ever materialised)."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"optim.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.ppo_epochs < 1 or self.mini_batches < 1:
            raise ValueError(f"optim.ppo_epochs and optim.mini_batches must be >= 1, got "
                             f"{self.ppo_epochs} and {self.mini_batches}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0, got {self.grad_clip}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"optim.micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if self.chunk_size < 1:
            raise ValueError(f"optim.chunk_size must be >= 1, got {self.chunk_size}")


def lr_factor(step: int, cfg: OptimConfig, total_steps: int | None) -> float:
    """Multiplier of `cfg.lr` for optimizer step `step` (0-based): linear warmup, then the schedule
    decaying over the remaining steps up to `total_steps` (None: no decay, the schedule needs a horizon)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.lr_schedule == "constant" or not total_steps or total_steps <= cfg.warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps - 1))
    floor = cfg.min_lr_ratio
    if cfg.lr_schedule == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


LEARNER_BACKENDS = ("torch", "deepspeed")
LORA_FORBIDDEN_TARGETS = ("lm_head", "embed_tokens")


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters (peft): only the adapters train; the reference model is the base model with the
    adapters switched off (no second copy of the weights); exports and weight syncs are merged."""

    enabled: bool = False
    """Train LoRA adapters instead of the full model."""
    r: int = 16
    """Rank of each adapter."""
    alpha: float = 32.0
    """Adapter scale numerator: the update is (alpha / r) · B·A."""
    dropout: float = 0.0
    """Dropout on the adapter input while training."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj")
    """Names of the Linear modules that get adapters (Qwen2 attention and MLP projections). The LM head
    and embeddings are excluded: the learner reads the LM head weight directly for its statistics."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules is empty: name the Linear modules to adapt, e.g. [q_proj, "
                             "v_proj]")
        if bad := [m for m in self.target_modules if m in LORA_FORBIDDEN_TARGETS]:
            raise ValueError(f"lora.target_modules may not include {bad}: the learner's log-prob/entropy "
                             "pass uses the LM head weight directly; adapt the transformer layers only")


@dataclass(frozen=True)
class LearnerConfig:
    """Where and how the learner runs: plain single-process torch, or DeepSpeed (ZeRO 0–3) over the
    ranks torchrun started (nccl on GPUs, gloo on CPU)."""

    backend: str = "torch"
    """torch (one process, the model's own dtype) or deepspeed (data-parallel ZeRO; launch with torchrun or
    the deepspeed launcher)."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage: 0 plain data parallel, 1 partitioned optimizer state, 2 + gradients, 3 +
    parameters (the reference model is then partitioned too)."""
    bf16: bool = False
    """DeepSpeed bf16 training: bf16 weights and activations, fp32 master weights in the optimizer (meant
    for GPUs; DeepSpeed 0.19 also runs it on CPU, slowly)."""
    offload_optimizer: bool = False
    """ZeRO-Offload: optimizer state and step on the CPU (stage >= 1). Uses DeepSpeed's CPUAdam, whose
    C++ extension compiles on first use (~90 s); meant for GPU runs short of memory."""
    offload_param: bool = False
    """ZeRO-3 parameter offload to CPU (stage 3 only)."""
    dist_backend: str = "auto"
    """Process-group backend: auto (nccl with CUDA, else gloo), nccl or gloo."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (both backends)."""

    def __post_init__(self) -> None:
        if self.backend not in LEARNER_BACKENDS:
            raise ValueError(f"learner.backend must be one of {LEARNER_BACKENDS}, got {self.backend!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"learner.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.dist_backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"learner.dist_backend must be auto, nccl or gloo, got {self.dist_backend!r}")
        if self.backend == "torch" and (self.bf16 or self.offload_optimizer or self.offload_param):
            raise ValueError("learner.bf16 / offload_optimizer / offload_param need learner.backend: "
                             "deepspeed (the torch backend trains in the model's own dtype on one device)")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("learner.offload_optimizer needs learner.zero_stage >= 1 (ZeRO-Offload)")
        if self.offload_param and self.zero_stage != 3:
            raise ValueError(f"learner.offload_param needs learner.zero_stage: 3, got {self.zero_stage}")

    @property
    def needs_process_group(self) -> bool:
        """DeepSpeed needs a process group even in one process (`dist.init_distributed(required=...)`)."""
        return self.backend == "deepspeed"
