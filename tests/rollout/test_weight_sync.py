"""Weight sync in memory (`rollout.weight_sync: memory`, swerl/rollout/weight_sync.py): the learner's
weights stream in buckets of the configured size into the hf engine in process, and over a real gloo
group into the strict SGLang double (its side of the group built the way SGLang 0.5.21 builds it, in a
scheduler process of its own; buckets received with `load_format: flattened_bucket`); afterwards the
engine serves the learner's weights: its logprobs of a sampled continuation equal a float64
teacher-forced pass of the learner's model. A CPU vLLM server (the real one) is refused when the
engine opens: vLLM 0.32 has no CPU weight transfer backend.

Tolerance of the logprob checks: the engine's pass is fp32 and the reference float64, so only the
engine's rounding counts — by rollout_helpers' bound ≲ 1e-4 per fp32 pass (λ = 7), so abs = 1e-4.
Before the sync the same check misses by far more (asserted), so it has the power to tell."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch
from fakes.fake_sglang import FakeSGLangServer
from rollout_helpers import teacher_forced_logprobs

from swerl.learner import AlgoConfig, Learner, OptimConfig
from swerl.learner.weights import MIB, bucketed
from swerl.rollout import EngineError, SGLangEngine
from swerl.rollout.config import RolloutConfig, SGLangServerConfig
from swerl.rollout.hf import HFEngine
from swerl.rollout.weight_sync import sync_in_memory
from swerl.structs import SamplingParams

TOL = 1e-4


def _learner(model_dir) -> Learner:
    """A learner on the tiny model whose weights then move (as an update would move them)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    learner = Learner(model, AlgoConfig(), OptimConfig())
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * (p.std() if p.numel() > 1 else 1.0))
    return learner


def _max_gap(engine_lp, learner, prompt, ids) -> float:
    ref = copy.deepcopy(learner.policy).double().eval()
    want = teacher_forced_logprobs(ref, prompt, list(ids))
    return max(abs(a - b) for a, b in zip(engine_lp, want, strict=True))


def test_buckets_respect_the_size_and_cover_the_policy(tiny_model_dir):
    learner = _learner(tiny_model_dir)
    state = learner.policy_state_dict()
    tied = {"lm_head.weight"}  # the tiny model ties its output layer: that weight comes once
    for mb in (0.05, 0.5, 4.0, 1e4):
        limit = int(mb * MIB)
        buckets = list(learner.iter_weight_buckets(limit))
        for b in buckets:
            assert b.nbytes <= limit or len(b.names) == 1  # a larger weight travels alone
        assert [b.index for b in buckets] == list(range(len(buckets)))
        assert [b.last for b in buckets] == [False] * (len(buckets) - 1) + [True]
        names = [n for b in buckets for n in b.names]
        assert names == [n for n in state if n not in tied]
        for b in buckets:
            for n, t in zip(b.names, b.tensors, strict=True):
                assert torch.equal(t, state[n])
        assert [(m.name, m.dtype, m.shape) for m in learner.weight_meta()] == [
            (n, state[n].dtype, tuple(state[n].shape)) for n in names]
        flat = buckets[0].flattened()
        assert flat.dtype == torch.uint8 and flat.numel() == buckets[0].nbytes
    assert len(list(learner.iter_weight_buckets(int(0.05 * MIB)))) > 5


def test_bucketing_is_lazy():
    """A bucket is handed out before the next weight is even produced past it: the stream is never
    materialised."""
    produced = []

    def weights():
        for i in range(6):
            produced.append(i)
            yield f"w{i}", torch.zeros(256)  # 1 KiB each

    it = bucketed(weights(), 2048)
    first = next(it)
    assert first.names == ("w0", "w1") and produced == [0, 1, 2]
    assert [b.names for b in it] == [("w2", "w3"), ("w4", "w5")]


@pytest.mark.parametrize("bad, match", [
    ({"weight_bucket_mb": 0}, r"rollout\.weight_bucket_mb must be > 0"),
    ({"weight_bucket_mb": -3}, r"rollout\.weight_bucket_mb must be > 0"),
    ({"weight_bucket_mb": math.nan}, r"rollout\.weight_bucket_mb must be > 0"),
    ({"weight_sync": "ram"}, r"rollout\.weight_sync must be one of \('memory', 'disk'\), got 'ram'"),
])
def test_bad_settings_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match) as e:
        RolloutConfig(**bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"rollout\.weight_bucket_mb must be > 0"):
        list(bucketed([("w", torch.zeros(1))], 0))


def test_config_defaults_stay_on_disk():
    r = RolloutConfig()
    assert r.weight_sync == "disk" and r.weight_bucket_bytes == 512 * MIB
    assert RolloutConfig(engine="vllm").engine_config.weight_transfer_backend == ""
    assert RolloutConfig(engine="vllm", weight_sync="memory").engine_config.weight_transfer_backend == "nccl"


def test_memory_sync_into_the_hf_engine(tiny_model_dir, tok):
    learner = _learner(tiny_model_dir)
    engine = HFEngine(tiny_model_dir, seed=0)
    prompt = tok("def mean(values):")["input_ids"]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)

    async def go():
        before = await engine.generate(prompt, params)
        stats = await sync_in_memory(RolloutConfig(weight_sync="memory", weight_bucket_mb=0.25), engine,
                                     learner)
        after = await engine.generate(prompt, params)
        return before, stats, after

    before, stats, after = asyncio.run(go())
    assert stats.buckets > 3
    assert _max_gap(before.logprobs, learner, prompt, before.token_ids) > 100 * TOL
    assert _max_gap(after.logprobs, learner, prompt, after.token_ids) <= TOL
    assert engine.weight_version == 1


def test_hf_engine_refuses_an_incomplete_or_foreign_stream(tiny_model_dir):
    engine = HFEngine(tiny_model_dir)
    learner = _learner(tiny_model_dir)
    buckets = list(learner.iter_weight_buckets(int(0.5 * MIB)))
    with pytest.raises(EngineError, match=r"no new value for \d+ weight\(s\)"):
        asyncio.run(engine.update_weights_from_buckets(buckets[:-1]))
    odd = bucketed([("model.nope.weight", torch.zeros(2))], MIB)
    with pytest.raises(EngineError, match=r"the model has no weight 'model\.nope\.weight'"):
        asyncio.run(engine.update_weights_from_buckets(odd))


def test_memory_sync_to_the_sglang_double_over_gloo(tiny_model_dir, tok):
    """Two syncs (the group is set up once), each one session: begin, one flattened-bucket update per
    bucket of at most the bucket size (cache flushed and version set by the last only), end; then the
    double serves the learner's weights."""
    learner = _learner(tiny_model_dir)
    rollout = RolloutConfig(engine="sglang", weight_sync="memory", weight_bucket_mb=0.5)
    prompt = tok("def mean(values):")["input_ids"]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, release="0.5.21") as fake:
        async def go():
            engine = await SGLangEngine.start(SGLangServerConfig(urls=(fake.url,)))
            before = await engine.generate(prompt, params)
            first = await sync_in_memory(rollout, engine, learner)
            with torch.no_grad():
                learner.policy.model.norm.weight.mul_(1.5)  # another "update"
            second = await sync_in_memory(rollout, engine, learner)
            after = await engine.generate(prompt, params)
            await engine.close()
            return engine, before, first, second, after

        engine, before, first, second, after = asyncio.run(go())
        paths = fake.paths()
        assert paths.count("/init_weights_update_group") == 1
        updates = [b for _, p, b in fake.requests if p == "/update_weights_from_distributed"]
        assert len(updates) == first.buckets + second.buckets and first.buckets > 3
        one = updates[:first.buckets]
        assert all(u["load_format"] == "flattened_bucket" for u in one)
        assert [u["flush_cache"] for u in one] == [False] * (len(one) - 1) + [True]
        assert [u.get("weight_version") for u in one] == [None] * (len(one) - 1) + ["1"]
        for u in one:
            size = sum(math.prod(s) * 4 for s in u["shapes"])  # float32
            assert size <= rollout.weight_bucket_bytes or len(u["names"]) == 1
        start = paths.index("/begin_weight_update")
        assert paths[start:start + first.buckets + 2] == (
            ["/begin_weight_update"] + ["/update_weights_from_distributed"] * first.buckets
            + ["/end_weight_update"])
        assert fake.weight_version == "2" and engine.weight_version == 2 and not fake.session_open
    assert _max_gap(before.logprobs, learner, prompt, before.token_ids) > 100 * TOL
    assert _max_gap(after.logprobs, learner, prompt, after.token_ids) <= TOL


def test_memory_sync_to_a_server_on_another_network_host(tiny_model_dir, tok, tmp_path):
    """The learner's rank 0 here, the SGLang double on another network host (`netns_node`: its own
    address, reached over a link; loopback there is not this machine's, and this machine's hostname
    resolves to loopback): with no `weight_group_address` the group address is the one this machine
    reaches the server from (the link's, never loopback or the hostname's), rank 0's gloo binds to that
    link, and afterwards the server serves the learner's weights. The server's own gloo side gets its
    interface the way an operator gives one to SGLang (GLOO_SOCKET_IFNAME)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from swerl.cluster.onebox import netns_node
    from swerl.rollout.weight_sync import group_address

    learner = _learner(tiny_model_dir)
    rollout = RolloutConfig(engine="sglang", weight_sync="memory", weight_bucket_mb=0.5)
    prompt = tok("def mean(values):")["input_ids"]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    serve = Path(__file__).resolve().parent / "fakes" / "serve_sglang.py"
    url_file = tmp_path / "url"
    with netns_node("swerl-t-ws") as node:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": node.interface}
        proc = subprocess.Popen(node.command([sys.executable, str(serve), "--model", str(tiny_model_dir),
                                              "--host", node.address, "--url-file", str(url_file)]),
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while not url_file.exists():
                assert proc.poll() is None and time.monotonic() < deadline, \
                    proc.stderr.read().decode()[-3000:]
                time.sleep(0.2)
            url = url_file.read_text()
            assert url.startswith(f"http://{node.address}:")
            assert group_address("", [url]) == node.peer

            async def go():
                engine = await SGLangEngine.start(SGLangServerConfig(urls=(url,)))
                before = await engine.generate(prompt, params)
                stats = await sync_in_memory(rollout, engine, learner)
                after = await engine.generate(prompt, params)
                await engine.close()
                return before, stats, after

            before, stats, after = asyncio.run(go())
        finally:
            proc.terminate()
            proc.wait(30)
    assert stats.buckets > 3
    assert _max_gap(before.logprobs, learner, prompt, before.token_ids) > 100 * TOL
    assert _max_gap(after.logprobs, learner, prompt, after.token_ids) <= TOL


def test_disk_sync_to_a_server_on_another_machine_needs_a_shared_directory():
    """weight_sync disk: servers on this machine (loopback, or an address of its own) read <run_dir>/weights;
    a server elsewhere is refused in one line unless rollout.weights_dir names a shared directory."""
    from swerl.net import address_towards
    from swerl.rollout.weight_sync import check_disk_sync

    disk = RolloutConfig(engine="sglang", weight_sync="disk")
    check_disk_sync(disk, ["http://127.0.0.1:30000", "http://localhost:30001"])
    try:
        own = address_towards("203.0.113.5")  # TEST-NET-3: the default route's source address, this machine's
    except OSError:
        own = None
    if own is not None:
        check_disk_sync(disk, [f"http://{own}:30000"])
    elsewhere = ["http://127.0.0.1:30000", "http://203.0.113.5:30000"]
    with pytest.raises(EngineError, match=r"server at http://203\.0\.113\.5:30000 runs on another machine.*"
                                          r"rollout\.weights_dir") as e:
        check_disk_sync(disk, elsewhere)
    assert "\n" not in str(e.value)
    check_disk_sync(RolloutConfig(engine="sglang", weight_sync="disk", weights_dir="/shared/w"), elsewhere)
    check_disk_sync(RolloutConfig(engine="sglang", weight_sync="memory"), elsewhere)


def test_train_disk_sync_writes_to_the_shared_weights_dir(tiny_model_dir, tmp_path, tok):
    """`rollout.weights_dir`: each step's HF checkpoint goes there (the servers load it by that path), not
    under <run_dir>/weights."""
    from transformers import AutoModelForCausalLM

    from swerl.train import TrainConfig, _sync_weights
    from swerl.train_config import EnvConfig

    learner = _learner(tiny_model_dir)
    shared = tmp_path / "shared"
    cfg = TrainConfig(rollout=RolloutConfig(engine="sglang", weights_dir=str(shared)),
                      env=EnvConfig(kind="swe"))
    asyncio.run(_sync_weights(cfg, None, learner, tok, tmp_path / "run", 3))
    assert not (tmp_path / "run" / "weights").exists()
    loaded = AutoModelForCausalLM.from_pretrained(shared / "step_00000003")
    for name, t in learner.policy_state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t)


def test_train_sync_weights_takes_the_memory_path(tiny_model_dir, tmp_path):
    """`swerl.train._sync_weights` (what every step calls) streams with weight_sync memory and writes
    nothing under <run_dir>/weights."""
    from swerl.train import TrainConfig, _sync_weights

    learner = _learner(tiny_model_dir)
    engine = HFEngine(tiny_model_dir)
    cfg = TrainConfig(rollout=RolloutConfig(weight_sync="memory", weight_bucket_mb=1.0))
    asyncio.run(_sync_weights(cfg, engine, learner, None, tmp_path, 1))
    assert engine.weight_version == 1 and not (tmp_path / "weights").exists()
    for name, t in learner.policy_state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], t)


@pytest.mark.vllm
@pytest.mark.slow
def test_memory_sync_to_a_cpu_vllm_server_is_refused_at_start(tmp_path, tok):
    """The real vLLM CPU server, launched as a memory-sync run launches it (`--weight-transfer-config
    {"backend": "nccl"}`, dev mode), starts — and the engine refuses it before any step: it reports a
    CPU device (GET /server_info), and every backend of vLLM 0.32 needs CUDA."""
    from test_rollout_vllm import free_port, vllm_python

    from swerl.models import make_tiny_qwen
    from swerl.rollout.config import VLLMEngineConfig
    from swerl.rollout.factory import open_engine

    model_dir = make_tiny_qwen(tmp_path / "model", tie_word_embeddings=False, tokenizer=tok)
    rollout = RolloutConfig(engine="vllm", weight_sync="memory", vllm=VLLMEngineConfig(
        python=vllm_python(), port=free_port(), dtype="float32", max_model_len=4096, startup_timeout_s=400,
        server_args=("--gpu-memory-utilization", "0.1", "--enforce-eager"),
        server_env=("VLLM_CPU_KVCACHE_SPACE=1",)))
    refused = (r"^rollout\.weight_sync=memory: the vLLM server at http://\S+ runs on CPU, and vLLM 0\.32's "
               r"weight transfer backends all need CUDA")
    with pytest.raises(EngineError, match=refused) as e:
        asyncio.run(open_engine(rollout.engine_config, model_dir, concurrency=1, log_dir=tmp_path))
    assert "\n" not in str(e.value)
    log = next(tmp_path.glob("vllm-*.log")).read_text()
    assert '"backend": "nccl"' in log or "weight_transfer_config" in log  # it was launched for memory sync
