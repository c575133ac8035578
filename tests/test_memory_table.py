"""scripts/memory_table.py: DeepSpeed's estimates, the activation and KV terms, and its outputs agree
with hand computations, with DeepSpeed's own printout, and with what README / bench_out show."""

from __future__ import annotations

import importlib.util
import io
import math
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from swerl.models import param_stats

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mt():
    spec = importlib.util.spec_from_file_location("memory_table", ROOT / "scripts" / "memory_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_table"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(mt):
    return mt.build(mt.Workload())


def test_zero3_cold_equals_the_documented_formula_and_deepspeeds_printout(mt):
    s = param_stats("qwen2.5-32b")
    n, lmax, g = s.total, s.largest_layer, 8
    gpu, cpu = mt.model_states("zero3", s, g, 64)
    # DeepSpeed's ZeRO-3 formula without offload, zero_init: 4·largest layer + 18 bytes/param over G GPUs
    assert gpu == 4 * lmax + int(18 * n / g)
    assert cpu == int(lmax * 4 * g * 1.5)
    assert n == 32_763_876_352 and lmax == 152064 * 5120
    # and what DeepSpeed's own printer says for the same case (GiB, two decimals)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

    buf = io.StringIO()
    with redirect_stdout(buf):
        estimate_zero3_model_states_mem_needs_all_cold(n, lmax, num_gpus_per_node=g, num_nodes=1)
    line = next(ln for ln in buf.getvalue().splitlines()
                if "offload_param=none, offload_optimizer=none, zero_init=1" in ln)
    cpu_gb, gpu_gb = (float(x) for x in re.findall(r"([\d.]+)GB", line))
    assert gpu_gb == round(gpu / 2**30, 2) and cpu_gb == round(cpu / 2**30, 2)


def test_other_setups_by_hand(mt):
    s = param_stats("qwen2.5-7b")
    n, lmax = s.total, s.largest_layer
    assert mt.model_states("zero2", s, 4, 64) == (2 * n + int(18 * n / 4), int(n * 4 * 4 * 1.5))
    assert mt.model_states("zero3_offload_opt", s, 4, 64) == (4 * lmax + int(2 * n / 4), int(n * 16 * 1.5))
    assert mt.model_states("zero3_offload_all", s, 4, 64) == (4 * lmax, int(n * 18 * 1.5))
    lora = s.lora_params(64)
    assert mt.model_states("lora_zero3", s, 4, 64) == (4 * lmax + int(18 * lora / 4) + 2 * n // 4,
                                                      int(lmax * 4 * 4 * 1.5))
    with pytest.raises(ValueError, match="unknown setup"):
        mt.model_states("zero4", s, 4, 64)
    assert mt.reference_bytes("zero2", s, 4) == (2 * n, 0)
    assert mt.reference_bytes("zero3", s, 4) == (2 * n // 4, 0)
    assert mt.reference_bytes("zero3_offload_all", s, 4) == (0, 2 * n)
    assert mt.reference_bytes("lora_zero3", s, 4) == (0, 0)


def test_activation_terms_by_hand(mt):
    from swerl.models import PRESETS

    t, c = 32768, 2048
    parts = mt.activation_parts(PRESETS["qwen2.5-7b"], mt.Workload(), lora=False)
    # h 3584, 28 layers, 28 q heads and 4 kv heads of 128, I 18944, V 152064
    assert parts["checkpoints"] == 2 * 28 * t * 3584
    assert parts["layer"] == 2 * 2 * t * (4 * 3584 + 2 * 3584 + 2 * 512 + 4 * 18944)
    assert parts["lm_head"] == 12 * c * 152064 + 6 * 152064 * 3584 + 4 * t * 3584
    lora = mt.activation_parts(PRESETS["qwen2.5-7b"], mt.Workload(), lora=True)
    assert lora["layer"] - parts["layer"] == 2 * 2 * t * 7 * 64
    assert lora["lm_head"] == parts["lm_head"] - 6 * 152064 * 3584  # frozen head: no gradient
    q3 = mt.activation_parts(PRESETS["qwen3-8b"], mt.Workload(), lora=False)
    assert q3["layer"] == 2 * 2 * t * (4 * 4096 + 3 * 4096 + 3 * 1024 + 4 * 12288)  # + QK-norm inputs
    # a micro-batch budget below the context still holds one full-context episode
    short = mt.activation_parts(PRESETS["qwen2.5-7b"], mt.Workload(micro_batch_tokens=1024), lora=False)
    assert short == parts


def test_rollout_tp_choice_by_hand(mt):
    from swerl.models import PRESETS

    p, work, cap = PRESETS["qwen2.5-32b"], mt.Workload(), 81559 * 2**20
    n = param_stats("qwen2.5-32b").total

    def seqs(tp):
        return math.floor((0.85 * cap - 2 * n / tp) / (2 * 64 * (8 // tp) * 128 * 2 * 32768))

    assert seqs(2) < 16 <= seqs(4)
    plan = mt.choose_tp(p, 8, cap, work)
    assert (plan["tp"], plan["replicas"], plan["full_context_seqs"]) == (4, 2, seqs(4))
    # TP beyond the KV heads replicates them: Qwen2.5-1.5B has 2
    assert mt.kv_bytes_per_token_per_gpu(PRESETS["qwen2.5-1.5b"], 4) == 2 * 28 * 1 * 128 * 2
    assert not mt.valid_tp(PRESETS["qwen2.5-7b"], 8)  # 28 query heads


def test_rows_and_recommendations_are_consistent(mt, data):
    rows = data["rows"]
    assert len(rows) == len({(r["model"], r["layout"], r["setup"]) for r in rows}) == 60
    for r in rows:
        assert r["learner_gib_per_gpu"] == pytest.approx(r["states_gib"] + r["reference_gib"]
                                                         + r["activations_gib"])
        for gpu, cap in mt.GPUS.items():
            need = (r["learner_gib_per_gpu"] + r["rollout_resident_gib"]) * 2**30
            assert r["fits"][gpu] == (need <= 0.9 * cap)
    for name, per_gpu in data["recommendations"].items():
        for gpu, rec in per_gpu.items():
            assert rec["fits"], (name, gpu)
            assert rec["learner_gib_per_gpu"] * 2**30 <= 0.85 * mt.GPUS[gpu]
            assert rec["rollout_full_context_seqs_per_replica"] >= 16
            assert rec["learner_gpus"] + rec["rollout_gpus"] == 8 * rec["nodes"]
            # nothing faster fits: every setup before the chosen one overflows
            order = list(mt.SETUPS)
            for earlier in order[: order.index(rec["setup"])]:
                row = next(r for r in rows if r["model"] == name and r["layout"] == rec["layout"]
                           and r["setup"] == earlier)
                assert row["learner_gib_per_gpu"] * 2**30 > 0.85 * mt.GPUS[gpu]
    assert data["recommendations"]["qwen2.5-32b"]["H100-80GB"]["nodes"] == 2
    assert data["recommendations"]["qwen2.5-1.5b"]["H100-80GB"]["zero_stage"] == 2


def test_outputs_are_deterministic_and_readme_and_bench_out_are_current(mt, tmp_path):
    mt.main(["--quiet", "--out", str(tmp_path / "a" / "memory_table")])
    mt.main(["--quiet", "--out", str(tmp_path / "b" / "memory_table")])
    for ext in (".md", ".json"):
        first = (tmp_path / "a" / f"memory_table{ext}").read_bytes()
        assert first == (tmp_path / "b" / f"memory_table{ext}").read_bytes()
        assert first == (ROOT / "bench_out" / f"memory_table{ext}").read_bytes(), \
            f"bench_out/memory_table{ext} is stale: run scripts/memory_table.py --update-readme README.md"
    md = (tmp_path / "a" / "memory_table.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert mt.replace_readme_block(readme, md) == readme, \
        "README's memory table is stale: run scripts/memory_table.py --update-readme README.md"
    with pytest.raises(ValueError, match="markers"):
        mt.replace_readme_block("# no markers\n", md)
