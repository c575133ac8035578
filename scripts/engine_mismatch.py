"""Engine/learner log-prob mismatch per rollout engine (issue #17, item 5; one run, JSON out).

For each engine — `hf` (HFEngine in process), `vllm` (a real vLLM CPU server, float32, as the tests
run it), `sglang` (SGLangEngine on the strict SGLang 0.5.23 double, tests/rollout/fakes/fake_sglang.py) and,
with --vllm-auto, a vLLM server at its default `--dtype auto` (which vLLM resolves to bfloat16 for a
float32 checkpoint on CPU: what `swerl train` gets with `rollout.vllm.dtype: auto`) — sample --groups
prompts × --group-size sequences of --tokens tokens at temperature 1 from the same tiny random-init
checkpoint (the conformance suite's, tests/contract/test_engine.py), then recompute every sampled
token's log-prob the way the learner does (`swerl.learner.learner.sequence_stats` on a `collate`d
batch: the learner's importance-ratio path) and report, per engine, with d = engine lp − learner lp
over the sampled tokens:

    k1 = mean d                        (unbiased estimate of KL(sampler ‖ learner); may be < 0)
    k3 = mean (exp(−d) − 1 + d)         (unbiased, ≥ 0 termwise)
    max |d|, mean |d|

against the fp32 learner (what training sees on CPU) and against an fp64 pass of the same weights
(the exact values: the engine's own error). Probes of the conformance suite's non-conformance
findings are recorded too: log-probs at T = 0.7 (vs log_softmax(logits / 0.7) and vs the raw
distribution), generate_n(n = 3) at T = 0, and a greedy turn without stop ids past the model's EOS.

With --model (an HF directory or a shipped model's name, `smollm2-135m-instruct`), the same on that
model's real weights, with its own tokenizer and chat template (the probes, which need the conformance
checkpoint's references, are left out).

Run: .venv/bin/python scripts/engine_mismatch.py [--engines hf,vllm,sglang] [--vllm-auto]
     [--model smollm2-135m-instruct] [--out bench_out/engine_mismatch.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "rollout")]  # the suite, and the fakes it imports

from contract import engine_reference as conf  # noqa: E402  (the suite's checkpoint, prompts and helpers)

from swerl.agent import load_tokenizer  # noqa: E402
from swerl.structs import SamplingParams  # noqa: E402

MESSAGES = ("Write a function that reverses a list.", "Fix mean() in calc.", "Hello",
            "Run the tests and fix the bug.", "What is 2+2?", "Please fix the bug in utils.py",
            "Submit the patch.", "Fix the failing test in calc.py.")


def resolved_vllm_dtype(engine: Any) -> str | None:
    log = getattr(engine, "log_path", None)
    if not log or not Path(log).exists():
        return None
    m = re.findall(r"dtype=(torch\.\w+)", Path(log).read_text(errors="replace"))
    return m[0] if m else None


async def sample(engine: Any, prompts: list[list[int]], group_size: int,
                 tokens: int) -> list[tuple[Any, ...]]:
    p = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    return list(await asyncio.gather(*(engine.generate_n(q, p, group_size) for q in prompts)))


def measure(engine: Any, kind: str, prompts: list[list[int]], args: argparse.Namespace, learner32: Any,
            learner64: Any, pad_id: int) -> dict[str, Any]:
    t0 = time.monotonic()
    groups = asyncio.run(sample(engine, prompts, args.group_size, args.tokens))
    sample_s = time.monotonic() - t0
    eng_all, l32_all, l64_all = [], [], []
    finish: dict[str, int] = {}
    for prompt, gens in zip(prompts, groups, strict=True):
        eng, l32 = conf.learner_logprobs(learner32, prompt, gens, pad_id=pad_id)
        _, l64 = conf.learner_logprobs(learner64, prompt, gens, pad_id=pad_id)
        eng_all += eng
        l32_all += l32
        l64_all += l64
        for g in gens:
            finish[g.finish_reason] = finish.get(g.finish_reason, 0) + 1
    n_tok = sum(len(x) for x in eng_all)
    return {"sequences": sum(len(g) for g in groups), "tokens": n_tok, "finish_reasons": finish,
            "sample_s": round(sample_s, 3), "tokens_per_s": round(n_tok / sample_s, 1),
            "vs_learner_fp32": conf.mismatch(eng_all, l32_all), "vs_fp64": conf.mismatch(eng_all, l64_all),
            "learner_fp32_vs_fp64": conf.mismatch(l32_all, l64_all)}


def probes(engine: Any, ref: Any, learner32: Any, pad_id: int) -> dict[str, Any]:
    """The conformance suite's findings, measured (see tests/contract/test_engine.py)."""
    out: dict[str, Any] = {}
    gens = asyncio.run(engine.generate_n(ref.long_prompt, SamplingParams(temperature=0.7, max_new_tokens=16),
                                         4))
    eng, scaled = conf.learner_logprobs(learner32, ref.long_prompt, gens, temperature=0.7, pad_id=pad_id)
    _, raw = conf.learner_logprobs(learner32, ref.long_prompt, gens, temperature=1.0, pad_id=pad_id)
    out["t0.7_vs_scaled"] = conf.mismatch(eng, scaled)
    out["t0.7_vs_raw"] = conf.mismatch(eng, raw)
    try:
        g = asyncio.run(engine.generate_n(ref.long_prompt, SamplingParams(temperature=0.0, max_new_tokens=6),
                                          3))
        out["greedy_n3"] = {"ok": [list(x.token_ids) for x in g] == [ref.long_greedy[:6]] * 3}
    except Exception as e:  # the finding itself: record what the engine raised
        out["greedy_n3"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    g = asyncio.run(engine.generate(ref.prompt,
                                    SamplingParams(temperature=0.0, max_new_tokens=conf.GREEDY_STEPS)))
    out["no_stop_ids_past_eos"] = {"finish_reason": g.finish_reason, "tokens": len(g.token_ids),
                                   "ok": (g.finish_reason, list(g.token_ids)) == ("length", ref.greedy)}
    return out


def short_error(text: str) -> str:
    m = re.search(r'"message":"([^"]+)"', text)
    return m.group(1) if m else text[:70]


def table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    t = Table(title="engine log-probs vs the learner's (T = 1; d = engine − learner over the engine's "
                    "samples)")
    for col in ("engine", "dtype", "tokens", "k1", "k3", "max |d|", "mean |d|", "max |d| vs fp64", "tol ε"):
        t.add_column(col, justify="right")
    probe = Table(title="conformance probes")
    for col in ("engine", "T=0.7 max |d| vs scaled", "vs raw", "generate_n(3) at T=0",
                "no stop ids, past EOS"):
        probe.add_column(col, justify="right")
    for name, r in results.items():
        if "error" in r:
            t.add_row(name, "-", "-", "[red]" + r["error"][:80], *["-"] * 5)
            continue
        a, b, p = r["vs_learner_fp32"], r["vs_fp64"], r.get("probes")
        tol = r["tolerance"]
        t.add_row(name, str(r["dtype"]), str(a["tokens"]), f"{a['k1']:.2e}", f"{a['k3']:.2e}",
                  f"{a['max_abs']:.2e}", f"{a['mean_abs']:.2e}", f"{b['max_abs']:.2e}",
                  "-" if tol is None else f"{tol:.0e}")
        if p is None:
            continue
        eos = p["no_stop_ids_past_eos"]
        probe.add_row(name, f"{p['t0.7_vs_scaled']['max_abs']:.2e}", f"{p['t0.7_vs_raw']['max_abs']:.2e}",
                      "ok" if p["greedy_n3"]["ok"]
                      else "[red]" + short_error(p["greedy_n3"].get("error", "wrong ids")),
                      "ok" if eos["ok"] else f"[red]{eos['finish_reason']} after {eos['tokens']} tokens")
    console.print(t)
    if probe.row_count:
        console.print(probe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="hf,vllm,sglang", help="comma-separated: hf, vllm, sglang")
    ap.add_argument("--vllm-auto", action="store_true",
                    help="also a vLLM server at --dtype auto (bf16 on CPU)")
    ap.add_argument("--groups", type=int, default=4, help="prompts (one generate_n call each)")
    ap.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per sample (no stop ids)")
    ap.add_argument("--model", help="an HF directory or a shipped model's name instead of the conformance "
                                    "checkpoint (its own tokenizer; no probes)")
    ap.add_argument("--out", help="default: bench_out/engine_mismatch.json (with --model: "
                                  "bench_out/engine_mismatch_<name>.json)")
    args = ap.parse_args()
    kinds = ([k.strip() for k in args.engines.split(",") if k.strip()]
             + (["vllm-auto"] if args.vllm_auto else []))

    if args.model:
        from swerl.models.shipped import resolve_model

        model_dir = Path(resolve_model(args.model, log=print))
        tok = load_tokenizer(model_dir)
        ref = None
        name = Path(args.model).name
    else:
        tok = load_tokenizer()
        model_dir = conf.make_conformance_model(tok)
        ref = conf.build_reference(tok, conf.load_fp32(model_dir), model_dir)
        name = ""
    learner32 = conf.load_fp32(model_dir)
    learner64 = conf.load_fp32(model_dir, dtype=torch.float64)
    prompts = [conf.chat_prompt(tok, m)
               for m in (MESSAGES * (args.groups // len(MESSAGES) + 1))[:args.groups]]
    log_dir = ROOT / ".cache" / "engine_mismatch_logs"  # server logs (vLLM) stay out of bench_out
    results: dict[str, Any] = {}
    for kind in kinds:
        t0 = time.monotonic()
        print(f"[{kind}] starting …", flush=True)
        try:
            with conf.open_engine(kind, model_dir, tok, log_dir=log_dir) as engine:
                start_s = time.monotonic() - t0
                dtype = "float32" if kind in ("hf", "sglang", "vllm") else kind.removeprefix("vllm-")
                if kind.startswith("vllm"):
                    dtype = f"{dtype} (server: {resolved_vllm_dtype(engine)})"
                r = measure(engine, kind, prompts, args, learner32, learner64, tok.pad_token_id)
                r.update({"dtype": dtype, "start_s": round(start_s, 1),
                          "tolerance": conf.LOGPROB_TOL.get(kind) if ref is not None
                          else conf.REAL_LOGPROB_TOL})
                if ref is not None:
                    r["probes"] = probes(engine, ref, learner32, tok.pad_token_id)
        except Exception as e:
            r = {"error": f"{type(e).__name__}: {e}"[:2000]}
        results[kind] = r
        print(f"[{kind}] {json.dumps({k: v for k, v in r.items() if k != 'probes'})[:400]}", flush=True)

    table(results)
    out = Path(args.out or ROOT / "bench_out" / (f"engine_mismatch_{name}.json" if name
                                                 else "engine_mismatch.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "what": "engine log-probs vs the learner's recomputed log-probs of the same weights (T = 1)",
        "definitions": {"d": "engine logprob - learner logprob, per sampled token",
                        "k1": "mean d (unbiased KL(sampler || learner) estimate)",
                        "k3": "mean exp(-d) - 1 + d (unbiased, >= 0)",
                        "vs_learner_fp32": "learner = sequence_stats on an fp32 copy (collate'd batch)",
                        "vs_fp64": "the same pass in float64 (exact reference)",
                        "tolerance": "per-token bound the conformance suite asserts "
                                     "(tests/contract/test_engine.py; with --model, "
                                     "tests/contract/test_engine_real_model.py)"},
        "model": args.model or str(model_dir.relative_to(ROOT)), "groups": args.groups,
        "group_size": args.group_size,
        "tokens_per_sequence": args.tokens,
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "created": time.strftime("%Y-%m-%d %H:%M:%S"), "engines": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
