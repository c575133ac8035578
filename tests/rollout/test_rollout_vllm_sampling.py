"""VLLMEngine samples swerl's distribution only: a checkpoint whose generation_config.json names sampling
defaults (here top_k 1, i.e. greedy) does not change what a launched vLLM server samples
(`--generation-config vllm`; vllm 0.32 `config/model.py` l. 1847-1899), and `/reset_prefix_cache`
answering 200 with `success: false` (vllm 0.32 `entrypoints/serve/dev/cache/api_router.py` l. 20-44)
is retried, then an error. The first test starts a real vLLM CPU server (skip with -m 'not vllm')."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rollout_helpers import ROOT, greedy_reference, teacher_forced_logprobs
from test_rollout_vllm import free_port, vllm_python

from swerl.models import make_tiny_qwen
from swerl.rollout import EngineError, VLLMEngine
from swerl.rollout.config import VLLMServerConfig
from swerl.rollout.vllm import launch_command
from swerl.structs import SamplingParams


@pytest.mark.vllm
@pytest.mark.slow
def test_the_checkpoints_generation_config_does_not_set_the_sampling(tok, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied",
                               tie_word_embeddings=False, tokenizer=tok)
    served = tmp_path / "model"
    served.mkdir()
    for f in model_dir.iterdir():
        if f.is_file():
            (served / f.name).symlink_to(f)
    gen = json.loads((model_dir / "generation_config.json").read_text())
    (served / "generation_config.json").unlink()
    (served / "generation_config.json").write_text(json.dumps({**gen, "top_k": 1, "do_sample": True}))
    cfg = VLLMServerConfig(model_path=str(served), python=vllm_python(), port=free_port(), dtype="float32",
                           max_model_len=1024, startup_timeout_s=400,
                           extra_args=("--gpu-memory-utilization", "0.1"),
                           env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
    cmd = launch_command(cfg)
    assert cmd[cmd.index("--generation-config") + 1] == "vllm"  # before extra_args, which may override it
    assert cmd.index("--generation-config") < cmd.index("--gpu-memory-utilization")
    reference = AutoModelForCausalLM.from_pretrained(served).eval()
    p = tok("def mean(values):")["input_ids"]
    engine = asyncio.run(VLLMEngine.start(cfg, log_dir=tmp_path))
    try:
        gens = asyncio.run(engine.generate_n(p, SamplingParams(temperature=1.0, max_new_tokens=8), 4))
    finally:
        asyncio.run(engine.close())
    greedy = greedy_reference(reference, p, 8)
    # with the checkpoint's top_k 1 every sample would be the greedy one; the random tiny model's
    # temperature-1 distribution is near-uniform over 151k tokens, so a sample repeating it is ~impossible
    assert all(list(g.token_ids) != greedy for g in gens)
    for g in gens:
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference, p, list(g.token_ids)), abs=1e-3)


class _ResetStub:
    """Answers `/collective_rpc` with 200 and `/reset_prefix_cache` with `{"success": false}` for the
    first `refusals` calls, then `{"success": true}` — the shapes of vllm 0.32's dev routes."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.resets = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/reset_prefix_cache":
                    stub.resets += 1
                    body = {"success": stub.resets > stub.refusals}
                else:
                    body = {"results": [None]}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_reset_prefix_cache_refusals_are_retried_then_an_error(tmp_path):
    stub = _ResetStub(refusals=2)
    try:
        eng = VLLMEngine(VLLMServerConfig(urls=(stub.url,), backoff_s=0.05))
        asyncio.run(eng.update_weights(tmp_path))
        assert stub.resets == 3 and eng.weight_version == 1
        stub.refusals, stub.resets = 10**6, 0
        eng.reset_cache_wait_s = 0.5
        with pytest.raises(EngineError, match=r"reset_prefix_cache still answers success: false"):
            asyncio.run(eng.update_weights(tmp_path))
        assert stub.resets >= 2 and eng.weight_version == 1
    finally:
        stub.close()
