"""LoRA (peft) for the learner: a wrapper on the policy model, trained by either backend
(`swerl.learner.torch_backend`, `swerl.learner.ds_learner`): `apply_lora` puts the adapters on, the
base model (adapters off) is the frozen reference, and merged plain-HF weights go to weight syncs and
exports. A backend recognises a LoRA policy by `is_peft`; nothing else about it changes.

The reference of a LoRA run is the policy itself inside `disable_adapter()`: the base weights are
frozen, so base model = initial policy, and no second copy of the weights is kept. Merged weights
are computed as W + (alpha/r)·B·A per adapted layer into a new dict; the model is never merged in
place (merging and unmerging in floating point would drift the frozen base weights).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from swerl.learner.config import LoRAConfig

Gather = Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager[Any]]


def is_peft(model: Any) -> bool:
    """A peft-wrapped model (it has adapters and `disable_adapter`)."""
    return hasattr(model, "get_base_model") and hasattr(model, "disable_adapter")


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside `model` (itself unless peft-wrapped; adapters stay injected)."""
    return model.get_base_model() if is_peft(model) else model


def apply_lora(model: Any, cfg: LoRAConfig, *, seed: int = 0) -> Any:
    """`model` wrapped with LoRA adapters (peft); only the adapters require grad. The adapters are
    initialised from `seed` (B = 0, so the wrapped model computes exactly what `model` does), the same
    on every rank whatever the global RNG state."""
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                      target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, lcfg)


class AdapterDisabledReference:
    """The frozen reference of a LoRA policy: the same modules with the adapters switched off.

    Duck-types what the learner does with a reference model (`.to`, `.eval`, `.requires_grad_` are
    no-ops: they must not freeze or move the policy's adapters) and what `sequence_stats` reads
    (`.model(...)` runs inside `disable_adapter()`, `.lm_head` is the base LM head)."""

    def __init__(self, policy: Any) -> None:
        if not is_peft(policy):
            raise TypeError("a LoRA reference needs a peft policy: wrap the model with "
                            "swerl.learner.lora.apply_lora first")
        self.policy = policy

    def adapters_off(self) -> contextlib.AbstractContextManager[Any]:
        """While open, the policy's modules compute the reference (a backend's policy forward then
        is a reference forward: under DeepSpeed the one engine serves both)."""
        return self.policy.disable_adapter()

    def to(self, *args: Any, **kwargs: Any) -> AdapterDisabledReference:
        return self

    def eval(self) -> AdapterDisabledReference:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> AdapterDisabledReference:
        return self

    @property
    def lm_head(self) -> Any:
        return causal_lm(self.policy).lm_head

    def model(self, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return causal_lm(self.policy).model(**kwargs)


def _lora_layer_type() -> type | None:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is pinned; without it there are no LoRA layers to merge
        return None
    return LoraLayer


@torch.no_grad()
def merged_state_dict(model: Any, *, gather: Gather | None = None) -> dict[str, Tensor]:
    """Full weights of `model` on CPU under the plain transformers names, LoRA deltas merged in.

    `gather(params)` is a context manager that makes partitioned parameters whole while it is open
    (ZeRO-3: `deepspeed.zero.GatheredParameters`); it is opened one module at a time, so at most one
    layer is ever gathered. A tied weight is one tensor under both of its names."""
    gather = gather or (lambda params: contextlib.nullcontext())
    lora_type = _lora_layer_type()
    core = causal_lm(model)
    out: dict[str, Tensor] = {}
    copies: dict[int, Tensor] = {}

    def cpu(key: int, t: Tensor) -> Tensor:
        if key not in copies:
            copies[key] = t.detach().to("cpu", copy=True)
        return copies[key]

    inside_lora: str | None = None
    for name, mod in core.named_modules():
        if inside_lora is not None and name.startswith(inside_lora):
            continue  # base_layer / lora_A / lora_B of a layer already merged
        prefix = f"{name}." if name else ""
        if lora_type is not None and isinstance(mod, lora_type):
            inside_lora = prefix
            base = mod.get_base_layer()
            with gather(list(mod.parameters())):
                w = base.weight.detach()
                if not mod.merged:
                    for adapter in mod.active_adapters:
                        if adapter in mod.lora_A:
                            w = w + mod.get_delta_weight(adapter).to(w.dtype)
                out[prefix + "weight"] = w.to("cpu", copy=True)
                if getattr(base, "bias", None) is not None:
                    out[prefix + "bias"] = cpu(id(base.bias), base.bias)
            continue
        params = [(k, p) for k, p in mod._parameters.items() if p is not None]
        if params:
            with gather([p for _, p in params]):
                for k, p in params:
                    out[prefix + k] = cpu(id(p), p)
        for k, b in mod._buffers.items():
            if b is not None and k not in mod._non_persistent_buffers_set:
                out[prefix + k] = cpu(id(b), b)
    return out


def save_plain_hf(config: Any, state: dict[str, Tensor], directory: str | os.PathLike[str],
                  tokenizer: Any = None) -> None:
    """Write `state` (plain transformers names) as an HF checkpoint of the architecture in `config`,
    loadable with `AutoModelForCausalLM.from_pretrained`. The model is built on the meta device and
    takes the tensors of `state` as they are (no second copy of the weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
    tied = ({k for k in missing if k == "lm_head.weight"}
            if getattr(config, "tie_word_embeddings", False) else set())
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"merged weights do not fit {type(plain).__name__}: missing "
                           f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    plain.tie_weights()
    plain.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
