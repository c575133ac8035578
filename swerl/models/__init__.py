"""Models: the Qwen architectures swerl trains as presets, tiny random-init models for CPU runs and
tests, loading a user's config or checkpoint, and the fail-fast check of a model / tokenizer source.

Nothing is downloaded (the build machines reach no model hub): a preset is the architecture part of a
released checkpoint's `config.json`, `preset_config` turns it into a transformers `Qwen2Config` /
`Qwen3Config`, `random_init_model` builds the model from it (on `device="meta"` no memory is
allocated, which is how `parameter_count` and `scripts/memory_table.py` size the 32B models on a
laptop), and `load_model_config` / `load_model` read a user's own config.json or checkpoint directory.
This module is the single source of truth for these shapes (`scripts/bench_train.py` still carries a
copy of the 1.5B dims in its own `PRESETS`).

Tiny models (every one deterministic in its `seed`, and none of them touches the global RNG: a
caller's seeded stream goes on as if no model had been built):

* `make_tiny_qwen(dir)`: a random-init Qwen2 written as an HF directory next to the real Qwen
  tokenizer, shaped so every engine can serve it: the real Qwen2.5 vocabulary (151936 rows, so every id
  the tokenizer produces is valid) and `head_dim` 64, the smallest head size vLLM's CPU attention
  kernels accept;
* `make_toy_model(vocab_size)`: an in-memory Qwen2 over a token-level env's own small vocabulary
  (`swerl.envs.toy`).

`check_model_source` fails fast, with a message naming the option, on a model or tokenizer that is
neither a local HF directory nor a hub id that can be fetched.

Where the numbers come from: the `config.json` of each `-Instruct` checkpoint (the RL starting
points), cross-checked against public copies of those files. The Qwen2.5-Coder checkpoints of the
same size have the same architecture (same hidden / intermediate sizes, layers, heads, vocabulary and
tying), so `qwen2.5-coder-7b` etc. are aliases of the Qwen2.5 presets; base (non-Instruct)
checkpoints differ only in fields that change neither shapes nor parameter counts
(`max_position_embeddings` 131072 with a YaRN note instead of 32768, `eos_token_id`, and
`rms_norm_eps` 1e-5 for the 14B/32B base models). The sliding-window fields are left out: every
Qwen2.5 / Qwen3 checkpoint ships `use_sliding_window: false`, so they have no effect.

Parameter counts: computed exactly from a meta-device model, shared (tied) weights counted once, as
the model cards do. `QwenPreset.card_params_b` holds the card's "Number of Parameters" for the
test that checks the presets (the Qwen2.5-32B card says 32.5B, while its safetensors hold 32.76B
parameters, which is what the hub page shows as 32.8B and what this module computes).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QWEN2_VOCAB_SMALL = 151936
"""Embedding rows of the tied (small) Qwen2.5 models and of every Qwen3 model."""
QWEN2_VOCAB_LARGE = 152064
"""Embedding rows of the untied Qwen2.5 models (7B and up)."""
MODEL_TYPES = ("qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """The policy's initial weights (and tokenizer)."""

    path: str = ""
    """HF checkpoint directory (or hub id, when the hub is reachable) of the initial policy; empty: a
    random-init tiny model (toy env: its own vocabulary; other envs: a Qwen2 with the real Qwen
    tokenizer, written to <run_dir>/init_model)."""
    tokenizer: str = ""
    """Tokenizer directory or hub id; empty: the model's own, or the bundled Qwen tokenizer."""
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
class QwenPreset:
    """The architecture fields of one released Qwen checkpoint's config.json (plus its card's sizes)."""

    name: str
    """Preset name, e.g. `qwen2.5-7b` (lower case; `qwen2.5-coder-7b` is an alias of it)."""
    model_type: str
    """`qwen2` (Qwen2.5 and Qwen2.5-Coder: QKV bias, no QK-norm) or `qwen3` (QK-norm, no bias)."""
    checkpoints: tuple[str, ...]
    """Hub ids with this architecture; the field values below are the first one's config.json."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """Key/value heads (grouped-query attention)."""
    head_dim: int | None
    """Per-head width when the config states it (Qwen3: 128); None means hidden_size / heads (Qwen2)."""
    vocab_size: int
    """Embedding rows (the tokenizer's ids padded up)."""
    max_position_embeddings: int
    """Context length the checkpoint declares."""
    rope_theta: float
    """RoPE base frequency."""
    rms_norm_eps: float
    """RMSNorm epsilon."""
    tie_word_embeddings: bool
    """The LM head shares the input embedding's weight (the small models)."""
    bos_token_id: int
    """`bos_token_id` of the config."""
    eos_token_id: int
    """`eos_token_id` of the config (`<|im_end|>` for chat checkpoints)."""
    card_params_b: str
    """"Number of Parameters" on the model card, in billions, as printed (e.g. "7.61")."""
    card_non_embedding_b: str
    """"Number of Parameters (Non-Embedding)" on the model card, in billions, as printed."""

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.name}: {self.num_attention_heads} query heads are not a multiple of "
                             f"{self.num_key_value_heads} key/value heads")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{self.name}: hidden_size {self.hidden_size} is not divisible by "
                             f"{self.num_attention_heads} heads; state head_dim")

    @property
    def attn_head_dim(self) -> int:
        """Per-head width actually used by the attention."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies in bf16: K and V, every layer, every KV head."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.attn_head_dim * 2


def _qwen25(name: str, checkpoint: str, *, hidden: int, inter: int, layers: int, heads: int, kv: int,
            vocab: int, tie: bool, card: str, card_ne: str) -> QwenPreset:
    # Everything not passed is identical across the Qwen2.5(-Coder)-Instruct configs.
    return QwenPreset(name=name, model_type="qwen2", checkpoints=(checkpoint,
                                                                  checkpoint.replace("Qwen2.5-",
                                                                                     "Qwen2.5-Coder-"),
                                                                   checkpoint.removesuffix("-Instruct")),
                      hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=None, vocab_size=vocab,
                      max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=tie, bos_token_id=151643, eos_token_id=151645,
                      card_params_b=card, card_non_embedding_b=card_ne)


def _qwen3(name: str, checkpoint: str, *, hidden: int, inter: int, layers: int, heads: int, tie: bool,
           card: str, card_ne: str) -> QwenPreset:
    # Every dense Qwen3 has 8 KV heads of width 128, vocabulary 151936 and a 40960-token context.
    return QwenPreset(name=name, model_type="qwen3", checkpoints=(checkpoint,), hidden_size=hidden,
                      intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=8, head_dim=128, vocab_size=QWEN2_VOCAB_SMALL,
                      max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=tie, bos_token_id=151643, eos_token_id=151645,
                      card_params_b=card, card_non_embedding_b=card_ne)


PRESETS: dict[str, QwenPreset] = {p.name: p for p in (
    _qwen25("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", hidden=1536, inter=8960, layers=28, heads=12, kv=2,
            vocab=QWEN2_VOCAB_SMALL, tie=True, card="1.54", card_ne="1.31"),
    _qwen25("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", hidden=3584, inter=18944, layers=28, heads=28, kv=4,
            vocab=QWEN2_VOCAB_LARGE, tie=False, card="7.61", card_ne="6.53"),
    _qwen25("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", hidden=5120, inter=13824, layers=48, heads=40, kv=8,
            vocab=QWEN2_VOCAB_LARGE, tie=False, card="14.7", card_ne="13.1"),
    _qwen25("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", hidden=5120, inter=27648, layers=64, heads=40, kv=8,
            vocab=QWEN2_VOCAB_LARGE, tie=False, card="32.5", card_ne="31.0"),
    _qwen3("qwen3-1.7b", "Qwen/Qwen3-1.7B", hidden=2048, inter=6144, layers=28, heads=16, tie=True,
           card="1.7", card_ne="1.4"),
    _qwen3("qwen3-8b", "Qwen/Qwen3-8B", hidden=4096, inter=12288, layers=36, heads=32, tie=False,
           card="8.2", card_ne="6.95"),
    _qwen3("qwen3-14b", "Qwen/Qwen3-14B", hidden=5120, inter=17408, layers=40, heads=40, tie=False,
           card="14.8", card_ne="13.2"),
    _qwen3("qwen3-32b", "Qwen/Qwen3-32B", hidden=5120, inter=25600, layers=64, heads=64, tie=False,
           card="32.8", card_ne="31.2"),
)}
"""Every preset by name."""

ALIASES: dict[str, str] = {
    **{f"qwen2.5-coder-{size}": f"qwen2.5-{size}" for size in ("1.5b", "7b", "14b", "32b")},
}
"""Other names of the same architectures (Qwen2.5-Coder shares Qwen2.5's shapes size for size)."""


def get_preset(name: str) -> QwenPreset:
    """The preset called `name` (case-insensitive; hub ids like `Qwen/Qwen2.5-7B-Instruct` work too)."""
    key = name.strip().lower()
    key = key.removeprefix("qwen/").removesuffix("-instruct")
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}: choose one of {sorted(PRESETS)} "
                       f"(or {sorted(ALIASES)}), or load your own config.json with load_model_config(path)")
    return PRESETS[key]


def preset_config(name: str) -> Any:
    """A transformers `Qwen2Config` / `Qwen3Config` with the preset's published values (bf16)."""
    p = get_preset(name)
    common: dict[str, Any] = dict(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers, num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads, hidden_act="silu",
        max_position_embeddings=p.max_position_embeddings, rms_norm_eps=p.rms_norm_eps,
        tie_word_embeddings=p.tie_word_embeddings, use_sliding_window=False,
        rope_parameters={"rope_theta": p.rope_theta, "rope_type": "default"},
        bos_token_id=p.bos_token_id, eos_token_id=p.eos_token_id, dtype="bfloat16")
    if p.model_type == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common, head_dim=p.attn_head_dim, attention_bias=False)
    from transformers import Qwen2Config

    return Qwen2Config(**common)


def model_from_config(config: Any, *, dtype: Any = None, device: Any = "meta") -> Any:
    """A randomly initialised causal LM for a transformers config. `device="meta"` allocates nothing
    (shapes only: for counting and memory planning); a real device gets real random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if dtype is None else dtype
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def random_init_model(name: str, *, dtype: Any = None, device: Any = "meta") -> Any:
    """The preset's model, random init, nothing downloaded (default bf16 on the meta device)."""
    return model_from_config(preset_config(name), dtype=dtype, device=device)


@dataclass(frozen=True)
class ParamStats:
    """Parameter counts of one model, shared weights counted once."""

    total: int
    """All parameters."""
    embedding: int
    """Input embedding plus, when untied, the LM head (what model cards call "embedding")."""
    largest_layer: int
    """Most parameters held directly by one module (DeepSpeed's `largest_layer_params`: the gather
    buffer ZeRO-3 needs; for Qwen it is the embedding or the LM head)."""
    linear_in_out: tuple[tuple[int, int], ...]
    """(in_features, out_features) of every Linear inside the decoder layers (what LoRA adapts)."""

    @property
    def non_embedding(self) -> int:
        """Parameters outside the embedding and the LM head."""
        return self.total - self.embedding

    def lora_params(self, rank: int) -> int:
        """Trainable parameters of LoRA with rank `rank` on every decoder Linear: r·(in + out) each."""
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        return sum(rank * (i + o) for i, o in self.linear_in_out)


def param_stats_of(model: Any) -> ParamStats:
    """ParamStats of a built model (meta or real)."""
    import torch

    seen: dict[int, int] = {}
    for prm in model.parameters():
        seen[id(prm)] = prm.numel()
    largest = max(sum(prm.numel() for prm in m.parameters(recurse=False)) for m in model.modules())
    emb_weights = {id(model.get_input_embeddings().weight): model.get_input_embeddings().weight.numel()}
    out = model.get_output_embeddings()
    if out is not None:
        emb_weights[id(out.weight)] = out.weight.numel()
    linears = tuple((m.in_features, m.out_features) for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}")
    return ParamStats(total=sum(seen.values()), embedding=sum(emb_weights.values()), largest_layer=largest,
                      linear_in_out=linears)


def param_stats(name: str) -> ParamStats:
    """ParamStats of a preset (or alias), from its meta-device model (cached: the 32B takes ~2 s)."""
    return _param_stats(get_preset(name).name)


@functools.cache
def _param_stats(name: str) -> ParamStats:
    return param_stats_of(random_init_model(name, device="meta"))


def parameter_count(name: str) -> int:
    """Exact parameter count of a preset (tied weights once), computed from its meta-device model."""
    return param_stats(name).total


# ---- a user's own config.json / checkpoint -------------------------------------------------------------


def _config_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"{path} is a directory without a config.json: point at a Hugging Face "
                                    f"checkpoint directory (config.json + *.safetensors) or at a config.json")
    elif not p.is_file():
        raise FileNotFoundError(f"no such file or directory: {path} (expected a config.json or a checkpoint "
                                f"directory holding one; presets: {sorted(PRESETS)})")
    return p


def load_model_config(path: str | os.PathLike[str]) -> Any:
    """The transformers config of a user's config.json or checkpoint directory. Any causal-LM
    `model_type` transformers knows is accepted; a broken file says which file and why."""
    from transformers import AutoConfig

    file = _config_file(path)
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file} is not a readable JSON config: {e}") from e
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ValueError(f"{file} has no `model_type`: it is not a Hugging Face model config "
                         f"(expected e.g. \"model_type\": \"qwen2\")")
    try:
        return AutoConfig.for_model(**raw)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{file}: transformers cannot build a config from it: {e}") from e


def load_model(path: str | os.PathLike[str], *, dtype: Any = None, device: Any = "cpu") -> Any:
    """A causal LM from a checkpoint directory: its weights when it has any (`*.safetensors` /
    `*.bin`), else an error naming what is missing (use `model_from_config` for a random init)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = load_model_config(path)
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"{path} is a config file, not a checkpoint directory: use model_from_config("
                         f"load_model_config(path)) for a random init, or pass the directory")
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise FileNotFoundError(f"{directory} has a config.json but no weights (*.safetensors or *.bin)")
    dtype = torch.bfloat16 if dtype is None else dtype
    return AutoModelForCausalLM.from_pretrained(os.fspath(directory), config=config, dtype=dtype).to(device)


# ---- tiny random-init models ---------------------------------------------------------------------------


def make_tiny_qwen(directory: str | os.PathLike[str], *, hidden_size: int = 128, num_layers: int = 2,
                   num_heads: int = 2, num_kv_heads: int = 1, intermediate_size: int = 256,
                   vocab_size: int = QWEN2_VOCAB_SMALL, max_positions: int = 8192, seed: int = 0,
                   dtype: str = "float32", tie_word_embeddings: bool = True, tokenizer: Any = None) -> Path:
    """Write a random-init Qwen2ForCausalLM (config + safetensors) and the tokenizer to `directory`
    and return it. Deterministic in `seed`. An existing model written with the same arguments is
    reused (its `swerl_tiny.json` records them), so session fixtures and benchmarks stay cheap.

    `tie_word_embeddings`: share the embedding with the output layer (as small Qwen models do; half
    the size). vLLM's in-place weight reload breaks the tie, so a model whose weights a vLLM server
    will reload must be untied.
    `tokenizer`: a loaded HF tokenizer, default the bundled Qwen one (`swerl.agent.load_tokenizer`).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swerl.agent import load_tokenizer

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    out = Path(directory)
    args = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
            "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size, "vocab_size": vocab_size,
            "max_positions": max_positions, "seed": seed, "dtype": dtype}
    if not tie_word_embeddings:  # (only recorded when set, so existing tied models stay reusable)
        args["tie_word_embeddings"] = False
    if tokenizer is not None and hasattr(tokenizer, "base_ids"):  # a compact vocabulary: which ids matters
        import hashlib

        args["compact_ids"] = hashlib.sha256(json.dumps(list(tokenizer.base_ids)).encode()).hexdigest()
    marker = out / "swerl_tiny.json"
    if marker.is_file() and json.loads(marker.read_text()) == args:
        return out
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    if len(tok) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer ({len(tok)} ids)")
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings,
        rope_theta=1_000_000.0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, torch_dtype=dtype,
    )
    model = _seeded_init(lambda: Qwen2ForCausalLM(config).to(getattr(torch, dtype)), seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    marker.write_text(json.dumps(args))  # last: a half-written directory is never reused
    return out


def make_toy_model(vocab_size: int, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                   num_kv_heads: int = 2, intermediate_size: int = 128, seed: int = 0,
                   bos_id: int = 0) -> Any:
    """A random-init Qwen2ForCausalLM with a small vocabulary (deterministic in `seed`): the policy of a
    token-level env such as `swerl.envs.toy`. `bos_id` is also EOS and pad (the toy game's BOS is 0)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads,
                         num_key_value_heads=num_kv_heads, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=bos_id, eos_token_id=bos_id,
                         pad_token_id=bos_id)
    return _seeded_init(lambda: Qwen2ForCausalLM(config).float(), seed)


def _seeded_init(build: Callable[[], Any], seed: int) -> Any:
    """`build()` with torch's CPU generator seeded to `seed` and restored afterwards. transformers draws
    the init from the global generator and takes no generator of its own, so the seed is set there;
    forking it keeps the caller's stream (e.g. the training loop's, seeded once) untouched."""
    import torch

    with torch.random.fork_rng(devices=[]):  # the init runs on the CPU: no CUDA state to fork
        torch.manual_seed(seed)
        return build()


# ---- where a model or tokenizer comes from -------------------------------------------------------------


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_model_source(model: str, *, what: str = "--model", marker: str = "config.json") -> None:
    """Fail fast, with a clear message, when `model` is neither a local HF directory (holding `marker`)
    nor a hub id that can be fetched (transformers would retry an unreachable hub for half a minute).
    `what` names the option in the message; `marker="tokenizer_config.json"` checks a tokenizer."""
    path = Path(os.path.expanduser(model))
    kind = "an HF model" if marker == "config.json" else "a tokenizer"
    if path.is_dir():
        if not (path / marker).is_file():
            raise ValueError(f"{what} {model!r} is a directory without {marker}: not {kind} directory")
        return
    looks_like_path = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    if looks_like_path:
        raise ValueError(f"{what} {model!r}: no such directory")
    if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True") or not _hub_reachable():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, marker)
        if not isinstance(cached, str):
            need = ("the rollout engines need a local HF model directory (config, weights, tokenizer), e.g. "
                    "a checkpoint exported by the training loop" if marker == "config.json" else
                    "give a local tokenizer directory (e.g. the policy directory the training loop exports)")
            raise ValueError(f"{what} {model!r} is not a local directory and the Hugging Face hub is not "
                             f"reachable from here (nor is it in the local hub cache): {need}")
