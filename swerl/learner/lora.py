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
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from swerl.learner.config import LoRAConfig
from swerl.learner.weights import WeightMeta

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


def merged_state_dict(model: Any, *, gather: Gather | None = None) -> dict[str, Tensor]:
    """Full weights of `model` on CPU under the plain transformers names, LoRA deltas merged in.

    `gather(params)` is a context manager that makes partitioned parameters whole while it is open
    (ZeRO-3: `deepspeed.zero.GatheredParameters`); it is opened one module at a time, so at most one
    layer is ever gathered. A tied weight is one tensor under both of its names."""
    return dict(iter_merged_weights(model, gather=gather, aliases=True))


def iter_merged_weights(model: Any, *, gather: Gather | None = None, device: torch.device | str = "cpu",
                        aliases: bool = False) -> Iterator[tuple[str, Tensor]]:
    """`merged_state_dict`'s (name, tensor) pairs one module at a time, copied to `device`, so a
    caller that streams them (weight sync in buckets) holds at most one module beyond what it keeps.
    Collective under ZeRO-3 (every rank must drain it, in the same order). A tied weight comes once,
    under its first name, unless `aliases`: then under both names as the same tensor, which means
    every copy is kept until the end (the dict of `merged_state_dict` holds them anyway)."""
    gather = gather or (lambda params: contextlib.nullcontext())
    lora_type = _lora_layer_type()
    core = causal_lm(model)
    copies: dict[int, Tensor | None] = {}  # id of a parameter -> its copy (None: not kept, not aliased)

    def copy(key: int, t: Tensor) -> Tensor | None:
        if key in copies:
            return copies[key]
        c = t.detach().to(device, copy=True)
        copies[key] = c if aliases else None
        return c

    inside_lora: str | None = None
    with torch.no_grad():
        for name, mod in core.named_modules():
            if inside_lora is not None and name.startswith(inside_lora):
                continue  # base_layer / lora_A / lora_B of a layer already merged
            prefix = f"{name}." if name else ""
            out: list[tuple[str, Tensor | None]] = []
            if lora_type is not None and isinstance(mod, lora_type):
                inside_lora = prefix
                base = mod.get_base_layer()
                with gather(list(mod.parameters())):
                    w = base.weight.detach()
                    if not mod.merged:
                        for adapter in mod.active_adapters:
                            if adapter in mod.lora_A:
                                w = w + mod.get_delta_weight(adapter).to(w.dtype)
                    out.append((prefix + "weight", w.to(device, copy=True)))
                    if getattr(base, "bias", None) is not None:
                        out.append((prefix + "bias", copy(id(base.bias), base.bias)))
                yield from ((n, t) for n, t in out if t is not None)
                continue
            params = [(k, p) for k, p in mod._parameters.items() if p is not None]
            if params:
                with gather([p for _, p in params]):
                    out.extend((prefix + k, copy(id(p), p)) for k, p in params)
            for k, b in mod._buffers.items():
                if b is not None and k not in mod._non_persistent_buffers_set:
                    out.append((prefix + k, copy(id(b), b)))
            yield from ((n, t) for n, t in out if t is not None)


def merged_weight_meta(model: Any) -> list[WeightMeta]:
    """Name, dtype and full shape of each weight `iter_merged_weights` yields (aliases left out), in
    its order, read without gathering anything (a ZeRO-3 parameter's full shape is its `ds_shape`)."""
    lora_type = _lora_layer_type()
    seen: set[int] = set()
    out: list[WeightMeta] = []

    def add(name: str, t: Tensor) -> None:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(WeightMeta(name, t.dtype, tuple(getattr(t, "ds_shape", t.shape))))

    inside_lora: str | None = None
    for name, mod in causal_lm(model).named_modules():
        if inside_lora is not None and name.startswith(inside_lora):
            continue
        prefix = f"{name}." if name else ""
        if lora_type is not None and isinstance(mod, lora_type):
            inside_lora = prefix
            base = mod.get_base_layer()
            out.append(WeightMeta(prefix + "weight", base.weight.dtype,
                                  tuple(getattr(base.weight, "ds_shape", base.weight.shape))))
            if getattr(base, "bias", None) is not None:
                add(prefix + "bias", base.bias)
            continue
        for k, p in mod._parameters.items():
            if p is not None:
                add(prefix + k, p)
        for k, b in mod._buffers.items():
            if b is not None and k not in mod._non_persistent_buffers_set:
                add(prefix + k, b)
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
