"""What each Qwen size needs: GPU and CPU memory of the learner (DeepSpeed ZeRO) and the rollout engine.

For every preset of `swerl.models` × setup × GPU layout, one row:

model states   DeepSpeed's own estimators, the functions its
               `estimate_zero{2,3}_model_states_mem_needs_all_cold` printers call
               (`deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`,
               `deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs`), fed exact parameter
               counts from meta-device models (no weights anywhere). Per GPU, and CPU per node:
                 ZeRO-2            GPU 2N + 18N/G                CPU 4N·g·1.5
                 ZeRO-3            GPU 4·Lmax + 18N/G            CPU 4·Lmax·g·1.5          (zero_init)
                 ZeRO-3 + opt off  GPU 4·Lmax + 2N/G             CPU 16N·1.5/nodes
                 ZeRO-3 + all off  GPU 4·Lmax                    CPU 18N·1.5/nodes
               N parameters, Lmax the largest layer (the embedding / LM head), G learner GPUs, g per node.
               LoRA (rank r on every decoder Linear) on ZeRO-3: the frozen bf16 base is partitioned
               (2N/G, our term) and the estimator is fed the adapter's parameters only.
reference      the frozen bf16 copy that KL / ActFocus read: 2N per GPU under ZeRO-2, 2N/G partitioned
               under ZeRO-3, on CPU when parameters are offloaded; none for LoRA (the reference is the
               base model with the adapter switched off).
activations    learner, gradient checkpointing per decoder layer, T = max(micro_batch_tokens, context)
               tokens in flight, bf16, a memory-efficient attention kernel (no T×T scores):
                 checkpoints   2·L·T·h                   (each layer's input hidden states)
                 one layer     2 × 2·T·(4h + 2·dq + 2·dkv + 4·I [+ dq + dkv for Qwen3's QK-norm]
                                         [+ 7r for LoRA])  (its recomputed activations, and their
                                                            gradients while it runs backward)
                 LM head       12·C·V                    (three fp32 (C, V) chunk buffers of
                                                          swerl.algo.token_statistics, C = chunk_size;
                                                          bench_out/bench_cuda.json measured exactly
                                                          3.48 / 6.96 / 13.91 GiB for C = 2k / 4k / 8k)
                               + 6·V·h                   (fp32 accumulator of the LM-head gradient and its
                                                          bf16 cast; 0 for LoRA, whose head is frozen)
                               + 4·T·h                   (final hidden states and their gradient)
               The no-grad passes (old log-probs, reference) need less and run at other times.
rollout        SGLang per tensor-parallel group: bf16 weights 2N/TP per GPU; KV cache bytes per token
               2·layers·kv_heads·head_dim·2 (bf16 K and V), kv_heads split over TP (replicated when
               TP > kv_heads). With `mem_fraction_static` f the KV pool per GPU is f·capacity − weights;
               TP is the smallest that holds --min-rollout-seqs full-context sequences per replica.

"fits" = needed ≤ 90% of the card (81559 MiB H100, 143771 MiB H200, as nvidia-smi reports them): the
rest covers the CUDA context, NCCL and DeepSpeed communication buckets and allocator fragmentation.
In the 1-GPU layout learner and rollout share the card, so the rollout's weights and its KV for
4 full-context sequences are added (and `mem_fraction_static` must be lowered to what is left).

Recommendation per size and card, on the size's production layout (one 8-GPU node; two for 32B): the
first setup, in the order ZeRO-2, ZeRO-3, ZeRO-3 + optimizer offload, ZeRO-3 + all offload, LoRA
(fastest first), whose learner fills at most 85% of the card (5% more headroom than "fits", since the
activation term is an estimate), and the rollout TP above. Deterministic: no timing, no randomness.

Usage:
    python scripts/memory_table.py                         # prints, writes bench_out/memory_table.{md,json}
    python scripts/memory_table.py --update-readme README.md   # also refreshes the README section
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swerl.models import ALIASES, PRESETS, ParamStats, QwenPreset, param_stats

GIB = 2**30
MIB = 2**20
GPUS: dict[str, int] = {"H100-80GB": 81559 * MIB, "H200-141GB": 143771 * MIB}
"""Memory of each card as nvidia-smi reports it."""
USABLE = 0.90
"""Share of a card a setup may fill to count as fitting."""
RECOMMEND_FILL = 0.85
"""Share of a card a recommended learner setup may fill: 5% more headroom, as activations are an estimate."""
SETUPS = ("zero2", "zero3", "zero3_offload_opt", "zero3_offload_all", "lora_zero3")
SETUP_LABELS = {"zero2": "ZeRO-2", "zero3": "ZeRO-3", "zero3_offload_opt": "ZeRO-3 + opt offload",
                "zero3_offload_all": "ZeRO-3 + param & opt offload", "lora_zero3": "LoRA r{r} on ZeRO-3"}
LORA_TARGETS = 7
"""Adapted Linears per decoder layer: q, k, v, o, gate, up, down."""
ADDITIONAL_BUFFER_FACTOR = 1.5
"""DeepSpeed's estimators' default CPU buffer factor."""


@dataclass(frozen=True)
class Layout:
    """Where learner and rollout run."""

    name: str
    """Short label for tables."""
    learner_gpus: int
    """GPUs of the learner's DeepSpeed world (all on one node)."""
    rollout_gpus: int
    """GPUs of the rollout engines (0 with `shared`)."""
    nodes: int
    """Nodes in all."""
    shared: bool = False
    """Learner and rollout time-share the same GPU."""


@dataclass(frozen=True)
class Workload:
    """The run-config numbers the estimate depends on."""

    context: int = 32768
    """Longest episode in tokens (prompt + all turns): the rollout's max context and the learner's."""
    micro_batch_tokens: int = 32768
    """Learner micro-batch token budget; a longer episode gets a micro-batch of its own."""
    chunk_size: int = 2048
    """Tokens per chunk of the LM-head statistics."""
    lora_rank: int = 64
    """LoRA rank of the LoRA setup."""
    mem_fraction: float = 0.85
    """SGLang `mem_fraction_static` on rollout-only GPUs."""
    min_rollout_seqs: int = 16
    """Full-context sequences a rollout replica's KV pool must hold."""
    min_shared_rollout_seqs: int = 4
    """The same on a card that learner and rollout share (a development setup)."""

    @property
    def tokens(self) -> int:
        """Tokens of the largest micro-batch."""
        return max(self.micro_batch_tokens, self.context)


def layouts_for(preset: QwenPreset) -> tuple[Layout, ...]:
    """The layouts tabled for a preset; the last one is the recommended production layout."""
    n = param_stats(preset.name).total
    one_node = Layout("1 node: 4 learner + 4 rollout", 4, 4, 1)
    if n < 3e9:
        return (Layout("1 GPU shared", 1, 0, 1, shared=True), one_node)
    if n < 20e9:
        return (one_node,)
    return (one_node, Layout("2 nodes: 8 learner | 8 rollout", 8, 8, 2))


# ---- learner -------------------------------------------------------------------------------------------


def model_states(setup: str, stats: ParamStats, gpus: int, lora_rank: int) -> tuple[int, int]:
    """(GPU bytes per learner GPU, CPU bytes per node) of params, gradients and optimizer states,
    from DeepSpeed's estimators; the learner's `gpus` GPUs sit on one node."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    n, lmax = stats.total, stats.largest_layer
    if setup == "zero2":
        cpu, gpu = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=gpus, num_nodes=1,
                                                         cpu_offload=False,
                                                         additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR)
        return gpu, cpu
    offload = {"zero3": (False, False), "zero3_offload_opt": (True, False), "zero3_offload_all": (True, True),
               "lora_zero3": (False, False)}
    if setup not in offload:
        raise ValueError(f"unknown setup {setup!r}: choose one of {SETUPS}")
    opt_off, param_off = offload[setup]
    trained = stats.lora_params(lora_rank) if setup == "lora_zero3" else n
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        trained, lmax, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=opt_off, cpu_offload_params=param_off,
        zero_init=True, additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR)
    if setup == "lora_zero3":
        gpu += 2 * n // gpus  # the frozen bf16 base, partitioned (the estimator knows only trained params)
    return gpu, cpu


def reference_bytes(setup: str, stats: ParamStats, gpus: int) -> tuple[int, int]:
    """(GPU bytes per learner GPU, CPU bytes per node) of the frozen bf16 reference model."""
    n = stats.total
    if setup == "lora_zero3":
        return 0, 0  # the base model with the adapter disabled is the reference
    if setup == "zero2":
        return 2 * n, 0
    if setup == "zero3_offload_all":
        return 0, 2 * n
    return 2 * n // gpus, 0


def activation_parts(preset: QwenPreset, work: Workload, *, lora: bool) -> dict[str, int]:
    """Learner activation bytes per GPU with gradient checkpointing (see the module docstring)."""
    t, h, n_layers = work.tokens, preset.hidden_size, preset.num_hidden_layers
    dq = preset.num_attention_heads * preset.attn_head_dim
    dkv = preset.num_key_value_heads * preset.attn_head_dim
    per_token = 4 * h + 2 * dq + 2 * dkv + 4 * preset.intermediate_size
    if preset.model_type == "qwen3":
        per_token += dq + dkv  # QK-norm keeps its inputs
    if lora:
        per_token += LORA_TARGETS * work.lora_rank
    c = min(work.chunk_size, t)
    return {
        "checkpoints": 2 * n_layers * t * h,
        "layer": 2 * (2 * t * per_token),
        "lm_head": 12 * c * preset.vocab_size + (0 if lora else 6 * preset.vocab_size * h) + 4 * t * h,
    }


# ---- rollout -------------------------------------------------------------------------------------------


def valid_tp(preset: QwenPreset, tp: int) -> bool:
    """SGLang splits query heads evenly and KV heads evenly (or replicates them when TP > kv_heads)."""
    kv = preset.num_key_value_heads
    return preset.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def kv_bytes_per_token_per_gpu(preset: QwenPreset, tp: int) -> int:
    """KV-cache bytes one token takes on each GPU of a TP group."""
    heads_here = max(1, preset.num_key_value_heads // tp)
    return 2 * preset.num_hidden_layers * heads_here * preset.attn_head_dim * 2


def rollout_plan(preset: QwenPreset, tp: int, budget_per_gpu: float, work: Workload) -> dict[str, Any]:
    """Weights and KV capacity of one TP group when each GPU gives it `budget_per_gpu` bytes."""
    weights = 2 * param_stats(preset.name).total / tp
    pool = max(0.0, budget_per_gpu - weights)
    per_seq = kv_bytes_per_token_per_gpu(preset, tp) * work.context
    return {"tp": tp, "weights_gib_per_gpu": weights / GIB, "kv_pool_gib_per_gpu": pool / GIB,
            "kv_gib_per_seq_per_gpu": per_seq / GIB, "full_context_seqs": int(pool // per_seq)}


def choose_tp(preset: QwenPreset, rollout_gpus: int, capacity: int, work: Workload) -> dict[str, Any] | None:
    """The smallest valid TP whose replica holds `min_rollout_seqs` full-context sequences; None if none."""
    for tp in (1, 2, 4, 8):
        if tp > rollout_gpus or not valid_tp(preset, tp):
            continue
        plan = rollout_plan(preset, tp, work.mem_fraction * capacity, work)
        if plan["full_context_seqs"] >= work.min_rollout_seqs:
            return {**plan, "replicas": rollout_gpus // tp}
    return None


# ---- rows ----------------------------------------------------------------------------------------------


def row(preset: QwenPreset, layout: Layout, setup: str, work: Workload) -> dict[str, Any]:
    """One table row: learner memory per GPU and CPU per node, and whether it fits each card."""
    stats = param_stats(preset.name)
    lora = setup == "lora_zero3"
    states_gpu, states_cpu = model_states(setup, stats, layout.learner_gpus, work.lora_rank)
    ref_gpu, ref_cpu = reference_bytes(setup, stats, layout.learner_gpus)
    act = activation_parts(preset, work, lora=lora)
    learner = states_gpu + ref_gpu + sum(act.values())
    # on a shared card the engine's weights and its KV pool stay resident while the learner runs
    rollout_resident = (2 * stats.total
                        + work.min_shared_rollout_seqs * preset.kv_bytes_per_token * work.context
                        if layout.shared else 0)
    fits = {gpu: learner + rollout_resident <= USABLE * cap for gpu, cap in GPUS.items()}
    return {
        "model": preset.name, "layout": layout.name, "setup": setup,
        "setup_label": SETUP_LABELS[setup].format(r=work.lora_rank),
        "learner_gpus": layout.learner_gpus, "rollout_gpus": layout.rollout_gpus, "nodes": layout.nodes,
        "shared": layout.shared,
        "states_gib": states_gpu / GIB, "reference_gib": ref_gpu / GIB,
        "activations_gib": sum(act.values()) / GIB,
        "activation_parts_gib": {k: v / GIB for k, v in act.items()}, "learner_gib_per_gpu": learner / GIB,
        "cpu_gib_per_node": (states_cpu + ref_cpu) / GIB, "rollout_resident_gib": rollout_resident / GIB,
        "fits": fits,
    }


def gpu_ids(layout: Layout) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of each role (`rollout.sglang.gpus` of the train config): one node is split
    learner first; with two nodes each role has a node of its own."""
    if layout.nodes == 1:
        ids = list(range(layout.learner_gpus + layout.rollout_gpus))
        learner, rollout = ids[: layout.learner_gpus], ids[layout.learner_gpus:]
    else:
        learner, rollout = list(range(layout.learner_gpus)), list(range(layout.rollout_gpus))
    return {"learner_cuda_visible_devices": ",".join(map(str, learner)),
            "rollout_cuda_visible_devices": ",".join(map(str, rollout))}


def build(work: Workload) -> dict[str, Any]:
    """Every row, the per-preset rollout facts and the recommendations."""
    import deepspeed

    rows = [row(p, lay, s, work) for p in PRESETS.values() for lay in layouts_for(p) for s in SETUPS]
    presets: dict[str, Any] = {}
    recommendations: dict[str, Any] = {}
    for p in PRESETS.values():
        stats = param_stats(p.name)
        main = layouts_for(p)[-1]
        presets[p.name] = {
            "aliases": sorted(a for a, target in ALIASES.items() if target == p.name),
            "checkpoints": list(p.checkpoints), "params": stats.total, "non_embedding": stats.non_embedding,
            "largest_layer": stats.largest_layer,
            f"lora_r{work.lora_rank}_params": stats.lora_params(work.lora_rank),
            "kv_bytes_per_token": p.kv_bytes_per_token,
            "kv_gib_per_full_context_seq": p.kv_bytes_per_token * work.context / GIB,
            "weights_gib_bf16": 2 * stats.total / GIB,
        }
        recommendations[p.name] = {}
        for gpu, cap in GPUS.items():
            chosen = next((r for s in SETUPS for r in rows
                           if r["model"] == p.name and r["layout"] == main.name and r["setup"] == s
                           and r["learner_gib_per_gpu"] * GIB <= RECOMMEND_FILL * cap), None)
            tp = choose_tp(p, main.rollout_gpus, cap, work)
            rec: dict[str, Any] = {"layout": main.name, "nodes": main.nodes,
                                   "learner_gpus": main.learner_gpus, "rollout_gpus": main.rollout_gpus,
                                   **gpu_ids(main), "fits": chosen is not None and tp is not None}
            if chosen is not None:
                s = chosen["setup"]
                rec.update({
                    "setup": s, "zero_stage": 2 if s == "zero2" else 3,
                    "offload_optimizer": s in ("zero3_offload_opt", "zero3_offload_all"),
                    "offload_param": s == "zero3_offload_all",
                    "lora_rank": work.lora_rank if s == "lora_zero3" else None,
                    "learner_gib_per_gpu": chosen["learner_gib_per_gpu"],
                    "learner_headroom_gib": USABLE * cap / GIB - chosen["learner_gib_per_gpu"],
                    "cpu_gib_per_node": chosen["cpu_gib_per_node"]})
            rec.update({"gradient_checkpointing": True, "micro_batch_tokens": work.micro_batch_tokens,
                        "context_length": work.context, "chunk_size": work.chunk_size,
                        "mem_fraction_static": work.mem_fraction})
            if tp is not None:
                rec.update({"rollout_tp": tp["tp"], "rollout_replicas": tp["replicas"],
                            "rollout_weights_gib_per_gpu": tp["weights_gib_per_gpu"],
                            "rollout_full_context_seqs_per_replica": tp["full_context_seqs"]})
            recommendations[p.name][gpu] = rec
    return {
        "meta": {"workload": asdict(work), "gpus_mib": {k: v // MIB for k, v in GPUS.items()},
                 "usable": USABLE, "recommend_fill": RECOMMEND_FILL,
                 "deepspeed": deepspeed.__version__, "units": "GiB (2^30 bytes)",
                 "estimators": ["deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs",
                                "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs"],
                 "formulas": __doc__.split("Usage:")[0].strip()},
        "presets": presets, "rows": rows, "recommendations": recommendations,
    }


# ---- output --------------------------------------------------------------------------------------------


def _g(x: float) -> str:
    return f"{x:.1f}"


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def markdown(data: dict[str, Any]) -> str:
    """The three Markdown tables (recommendations, rollout, every row) with a short legend."""
    w = data["meta"]["workload"]
    gpus = list(GPUS)
    out = [f"Generated by `scripts/memory_table.py` (DeepSpeed {data['meta']['deepspeed']} estimators; GiB). "
           f"Context {w['context']} tokens, micro-batch budget {w['micro_batch_tokens']} tokens, gradient "
           f"checkpointing, LM-head chunk {w['chunk_size']}, a frozen reference model (KL / ActFocus), "
           f"\"fits\" = at most {int(USABLE * 100)}% of the card. `qwen2.5-*` rows hold for the same-size "
           f"Qwen2.5-Coder models (same architecture). Formulas: the script's docstring.", "",
           "**Recommended setup per size**: the first of ZeRO-2, ZeRO-3, ZeRO-3 + optimizer offload, ZeRO-3 "
           "+ param & optimizer offload (fastest first) whose learner fills at most "
           f"{int(RECOMMEND_FILL * 100)}% of the card; headroom = {int(USABLE * 100)}% of the card minus "
           "that. Gradient checkpointing on; rollout TP is the smallest whose replica's KV holds "
           f"{w['min_rollout_seqs']} full-context sequences.", "",
           "| model | card | nodes | GPUs learner / rollout | learner setup | learner GiB/GPU | headroom GiB "
           "| CPU GiB/node | rollout TP × replicas | full-context seqs / replica |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, per_gpu in data["recommendations"].items():
        for gpu, r in per_gpu.items():
            setup = SETUP_LABELS[r["setup"]].format(r=w["lora_rank"]) if "setup" in r else "none fits"
            tp = f"{r['rollout_tp']} × {r['rollout_replicas']}" if "rollout_tp" in r else "none fits"
            out.append(f"| {name} | {gpu} | {r['nodes']} | {r['learner_gpus']} / {r['rollout_gpus']} | "
                       f"{setup} | {_g(r.get('learner_gib_per_gpu', math.nan))} | "
                       f"{_g(r.get('learner_headroom_gib', math.nan))} | "
                       f"{_g(r.get('cpu_gib_per_node', math.nan))} | {tp} | "
                       f"{r.get('rollout_full_context_seqs_per_replica', '-')} |")
    out += ["", f"**Rollout (SGLang, bf16, `mem_fraction_static` {w['mem_fraction']})**: weights and KV "
                f"cache per full-context ({w['context']}-token) sequence:", "",
            "| model | params | weights GiB | KV bytes / token | KV GiB / sequence |",
            "|---|---|---|---|---|"]
    for name, p in data["presets"].items():
        out.append(f"| {name} | {p['params'] / 1e9:.2f} B | {_g(p['weights_gib_bf16'])} | "
                   f"{p['kv_bytes_per_token']} | {p['kv_gib_per_full_context_seq']:.2f} |")
    out += ["", "<details><summary>Every model × layout × setup</summary>", "",
            f"Learner GiB per GPU = model states (DeepSpeed's estimate) + reference + activations. In the "
            "\"1 GPU shared\" layout learner and rollout share the card, so \"fits\" also counts the "
            f"engine's weights and KV for {w['min_shared_rollout_seqs']} full-context sequences. CPU GiB per "
            f"node is DeepSpeed's estimate (plus the reference when parameters are offloaded).", "",
            "| model | layout | setup | model states | reference | activations | learner GiB/GPU | CPU "
            "GiB/node | "
            + " | ".join(f"fits {g}?" for g in gpus) + " |",
            "|---|---|---|---|---|---|---|---|" + "---|" * len(gpus)]
    for r in data["rows"]:
        out.append(f"| {r['model']} | {r['layout']} | {r['setup_label']} | {_g(r['states_gib'])} | "
                   f"{_g(r['reference_gib'])} | {_g(r['activations_gib'])} | {_g(r['learner_gib_per_gpu'])} "
                   f"| {_g(r['cpu_gib_per_node'])} | " + " | ".join(_yes(r["fits"][g]) for g in gpus) + " |")
    out += ["", "</details>"]
    return "\n".join(out) + "\n"


README_START = "<!-- memory-table:start (generated by scripts/memory_table.py --update-readme) -->"
README_END = "<!-- memory-table:end -->"


def replace_readme_block(text: str, block: str) -> str:
    """`text` with the part between the memory-table markers replaced by `block`."""
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {README_START!r} … {README_END!r} markers; add them where the table "
                         "goes")
    return text[: start + len(README_START)] + "\n" + block + text[end:]


def print_rich(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="learner memory per GPU (GiB)")
    for col in ("model", "layout", "setup", "states", "ref", "act", "learner/GPU", "CPU/node",
                *(f"fits {g}" for g in GPUS)):
        table.add_column(col, justify="left" if col in ("model", "layout", "setup") else "right")
    for r in data["rows"]:
        table.add_row(r["model"], r["layout"], r["setup_label"], _g(r["states_gib"]), _g(r["reference_gib"]),
                      _g(r["activations_gib"]), _g(r["learner_gib_per_gpu"]), _g(r["cpu_gib_per_node"]),
                      *(_yes(r["fits"][g]) for g in GPUS))
    console.print(table)
    rec = Table(title="recommended")
    for col in ("model", "card", "setup", "learner/GPU", "CPU/node", "rollout TP × replicas", "seqs/replica"):
        rec.add_column(col)
    for name, per_gpu in data["recommendations"].items():
        for gpu, r in per_gpu.items():
            rec.add_row(name, gpu, r.get("setup", "none fits"), _g(r.get("learner_gib_per_gpu", math.nan)),
                        _g(r.get("cpu_gib_per_node", math.nan)),
                        f"{r['rollout_tp']} × {r['rollout_replicas']}" if "rollout_tp" in r else "none fits",
                        str(r.get("rollout_full_context_seqs_per_replica", "-")))
    console.print(rec)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Workload()
    parser.add_argument("--context", type=int, default=d.context)
    parser.add_argument("--micro-batch-tokens", type=int, default=d.micro_batch_tokens)
    parser.add_argument("--chunk-size", type=int, default=d.chunk_size)
    parser.add_argument("--lora-rank", type=int, default=d.lora_rank)
    parser.add_argument("--mem-fraction", type=float, default=d.mem_fraction)
    parser.add_argument("--min-rollout-seqs", type=int, default=d.min_rollout_seqs)
    parser.add_argument("--out", default="bench_out/memory_table", help="writes OUT.md and OUT.json")
    parser.add_argument("--update-readme", metavar="README", help="replace the README's memory-table block")
    parser.add_argument("--quiet", action="store_true", help="no rich tables on stdout")
    args = parser.parse_args(argv)
    work = Workload(context=args.context, micro_batch_tokens=args.micro_batch_tokens,
                    chunk_size=args.chunk_size, lora_rank=args.lora_rank, mem_fraction=args.mem_fraction,
                    min_rollout_seqs=args.min_rollout_seqs)
    data = build(work)
    md = markdown(data)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    if args.update_readme:
        readme = Path(args.update_readme)
        readme.write_text(replace_readme_block(readme.read_text(), md))
    if not args.quiet:
        print_rich(data)
        print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    return data


if __name__ == "__main__":
    main()
