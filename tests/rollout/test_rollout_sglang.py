"""SGLangEngine against FakeSGLangServer, a strict double of SGLang 0.5.21 / 0.5.23 (SGLang itself needs
CUDA; tests/rollout/fakes/fake_sglang.py cites the SGLang code each of its rules follows). Generation is the
tiny HF model, so ids and logprobs are checked against teacher-forced passes. Each test named after
a server behaviour checks the client against that behaviour of the real server."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fakes.fake_sglang import FakeSGLangServer, learner_group
from rollout_helpers import greedy_reference, post, teacher_forced_logprobs

from swerl.agent import Engine
from swerl.models import make_tiny_qwen
from swerl.rollout import EngineError, EngineUnavailable, RolloutEngine, SGLangEngine
from swerl.rollout.config import SGLangServerConfig
from swerl.rollout.http import request
from swerl.rollout.sglang import (
    SGLANG_SUPPORTED,
    check_version,
    generate_payload,
    launch_command,
    parse_generate_output,
)
from swerl.structs import SamplingParams


@pytest.fixture(params=["0.5.21", "0.5.23"])
def fake(request, tiny_model_dir, tok):
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, release=request.param) as server:
        yield server


@pytest.fixture
def fake523(tiny_model_dir, tok):
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, release="0.5.23") as server:
        yield server


def attach(*urls: str, **kw) -> SGLangEngine:
    cfg = SGLangServerConfig(urls=urls, retries=kw.pop("retries", 4), backoff_s=kw.pop("backoff_s", 0.05),
                             **kw)
    return asyncio.run(SGLangEngine.start(cfg))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_generate_returns_the_models_tokens_and_logprobs(fake, tok, reference_model):
    eng = attach(fake.url)
    assert isinstance(eng, RolloutEngine) and isinstance(eng, Engine)
    assert asyncio.run(eng.health()) == {fake.url: True}
    prompt = tok("def mean(values):")["input_ids"]
    g = asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=7, temperature=1.0)))
    assert g.finish_reason == "length" and len(g.token_ids) == 7
    # abs=2e-4 here and below: two fp32 passes of the tiny model (see rollout_helpers)
    assert g.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, prompt, list(g.token_ids)),
                                       abs=2e-4)
    # the request is SGLang's native one: token ids in, logprobs of the output only, no text round trip
    _, path, body = fake.requests[-1]
    assert path == "/generate" and body["input_ids"] == prompt and "text" not in body
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    assert body["sampling_params"] == {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
        "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0, "max_new_tokens": 7,
        "stop_token_ids": [], "ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True}
    # startup: /health, the release (/server_info), then /model_info (not the deprecated /get_model_info)
    assert fake.paths()[:3] == ["/health", "/server_info", "/model_info"]
    assert eng.versions == {fake.url: fake.release}


def test_stop_token_and_n_samples(fake, tok, reference_model):
    eng = attach(fake.url)
    prompt = tok("The quick brown fox")["input_ids"]
    greedy = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=6)))
    assert list(greedy.token_ids) == greedy_reference(reference_model, prompt, 6)
    stop = greedy.token_ids[2]
    cut = list(greedy.token_ids).index(stop) + 1
    g = asyncio.run(eng.generate(prompt,
                                 SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop,))))
    assert g.finish_reason == "stop" and g.token_ids == greedy.token_ids[:cut]
    gens = asyncio.run(eng.generate_n(prompt, SamplingParams(max_new_tokens=4), 3))
    assert len(gens) == 3 and fake.requests[-1][2]["sampling_params"]["n"] == 3
    for x in gens:
        assert x.logprobs == pytest.approx(teacher_forced_logprobs(reference_model, prompt,
                                                                   list(x.token_ids)), abs=2e-4)


# ---- one test per behaviour of the real server --------------------------------------------------


def test_ignore_eos_skips_stop_token_ids(fake, tok, reference_model):
    """SGLang's `ignore_eos` returns before any token-based stop is checked, stop_token_ids included
    (Req._check_token_based_finish, schedule_batch.py 0.5.21 l. 1784): a client that sends it with
    stop ids gets every turn cut at max_new_tokens. swerl's client must stop at the stop id."""
    prompt = tok("def mean(values):")["input_ids"]
    stop = greedy_reference(reference_model, prompt, 4)[1]
    raw = generate_payload(prompt, SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop,)))
    raw["sampling_params"]["ignore_eos"] = True
    status, out = post(fake.url, "/generate", raw)
    assert status == 200 and out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert len(out["output_ids"]) == 6 and stop in out["output_ids"]  # sampled, and not stopped at
    eng = attach(fake.url)
    g = asyncio.run(eng.generate(prompt,
                                 SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop,))))
    assert g.finish_reason == "stop" and g.token_ids[-1] == stop and len(g.token_ids) <= 2


def test_the_models_eos_ends_a_turn_too(tiny_model_dir, tok, reference_model, tmp_path):
    """Without ignore_eos SGLang also stops at the model's EOS ids (config.json / generation_config.json
    eos_token_id, ModelConfig._get_hf_eos_token_id, model_config.py 0.5.21 l. 1999): reported as a stop
    on it, the token included. So the client sends ignore_eos exactly when it has no stop ids: then,
    as on the other engines, only max_new_tokens ends the generation."""
    prompt = tok("def mean(values):")["input_ids"]
    greedy = greedy_reference(reference_model, prompt, 5)
    model_dir = tmp_path / "eos-model"
    shutil.copytree(tiny_model_dir, model_dir)
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((model_dir / name).read_text())
        cfg["eos_token_id"] = [cfg["eos_token_id"], greedy[2]]
        (model_dir / name).write_text(json.dumps(cfg))
    with FakeSGLangServer(model_dir, tokenizer=tok) as server:
        eos = greedy[2]
        eng = attach(server.url)
        other = next(t for t in range(100, 1000) if t not in greedy)  # a stop id the decode never meets
        g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5,
                                                            stop_token_ids=(other,))))
        assert g.finish_reason == "stop" and list(g.token_ids) == greedy[:greedy.index(eos) + 1]
        g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5)))
        assert g.finish_reason == "length" and list(g.token_ids) == greedy[:5]
        assert server.requests[-1][2]["sampling_params"]["ignore_eos"] is True


@pytest.mark.parametrize("release", ["0.5.21", "0.5.23"])
def test_unknown_sampling_params_are_refused(release, tiny_model_dir, tok):
    """0.5.23's contract gate refuses an unknown sampling_params key with 400 (api_contract.py 0.5.23
    l. 12; api_types.py l. 1320); 0.5.21 fails it with a TypeError, HTTP 500 (tokenizer_manager.py
    0.5.21 l. 1478). Every key swerl's client sends is known to both."""
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, release=release) as server:
        raw = generate_payload([1, 2, 3], SamplingParams(max_new_tokens=2))
        assert post(server.url, "/generate", raw)[0] == 200
        raw["sampling_params"]["top_n_sigma"] = 1.0
        status, out = post(server.url, "/generate", raw)
        if release == "0.5.23":
            assert status == 400 and out["error"].startswith(
                "unknown field `top_n_sigma`, expected one of `max_new_tokens`, `stop`, `stop_token_ids`")
        else:
            assert (status, out) == (500, "Internal Server Error")
        raw["sampling_params"] = {"max_new_tokens": 2, "ignore_eos": "no"}
        status, out = post(server.url, "/generate", raw)
        if release == "0.5.23":  # a wrongly typed value is a contract violation too
            assert (status, out) == (400, {"error": 'invalid type: string "no", expected a boolean'})


def test_sampling_params_are_verified(fake523):
    """`SamplingParams.verify` (sampling_params.py 0.5.21 l. 224): a ValueError is HTTP 400
    `{"error": {"message": ...}}` (_create_error_response, http_server.py 0.5.21 l. 2143); temperature
    0 becomes greedy (top_k 1, l. 217-220)."""
    raw = generate_payload([1, 2, 3], SamplingParams(max_new_tokens=2))
    raw["sampling_params"]["top_p"] = 0.0
    assert post(fake523.url, "/generate",
                raw) == (400, {"error": {"message": "top_p must be in (0, 1], got 0.0."}})
    raw["sampling_params"].update(top_p=1.0, min_new_tokens=3)
    assert post(fake523.url, "/generate", raw) == (
        400, {"error": {"message": "min_new_tokens must be in [0, max_new_tokens(2)], got 3."}})
    assert post(fake523.url, "/generate",
                {"input_ids": []}) == (400, {"error": {"message": "input_ids cannot be empty."}})


def test_prompt_plus_max_new_tokens_over_the_context_is_refused(tiny_model_dir, tok):
    """TokenizerManager._validate_one_request (tokenizer_manager.py 0.5.21 l. 1291-1331): prompt +
    max_new_tokens over the context length is HTTP 400; the client says so in one error."""
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, context_length=32) as server:
        eng = attach(server.url)
        prompt = list(range(100, 120))
        assert len(asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=12))).token_ids) == 12
        with pytest.raises(EngineError,
                           match=r"HTTP 400: Requested token count exceeds the model's maximum context "
                                              r"length of 32 tokens. You requested a total of 33 tokens: 20 "
                                              r"tokens"):
            asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=13)))
        with pytest.raises(EngineError,
                           match=r"The input \(40 tokens\) is longer than the model's context length"):
            asyncio.run(eng.generate(list(range(100, 140)), SamplingParams(max_new_tokens=1)))


def test_preferred_sampling_params_of_the_server_do_not_apply(tiny_model_dir, tok, reference_model):
    """A request's sampling_params are laid over `--preferred-sampling-params`
    (tokenizer_manager.py 0.5.21 l. 1469): the client sends every distribution-shaping parameter, so a
    server preferring ignore_eos / top_k / a penalty samples swerl's distribution all the same (the
    double refuses non-neutral values with 501, so one leaking through would fail here)."""
    prompt = tok("def mean(values):")["input_ids"]
    stop = greedy_reference(reference_model, prompt, 4)[1]
    preferred = {"ignore_eos": True, "top_k": 20, "repetition_penalty": 1.3, "min_p": 0.1}
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, preferred_sampling_params=preferred) as server:
        eng = attach(server.url)
        g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=6,
                                                            stop_token_ids=(stop,))))
        assert g.finish_reason == "stop" and g.token_ids[-1] == stop
        assert post(server.url, "/generate",
                    {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}})[0] == 501


def test_health_answers_503_while_the_server_starts(tiny_model_dir, tok):
    """/health is 503 while the server starts (http_server.py 0.5.21 l. 713), then a one-token
    generation and 200: start() polls through the 503s."""
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok, starting_polls=3) as server:
        assert asyncio.run(request(server.url, "GET", "/health")).status == 503
        eng = attach(server.url)
        assert (server.paths()[:4] == ["/health"] * 4
                and server.paths()[4:6] == ["/server_info", "/model_info"])
        assert asyncio.run(eng.health()) == {server.url: True}


def test_a_server_outside_the_supported_releases_is_refused(fake523):
    """The API changes between releases (0.5.23's contract gate, 0.5.21's weight-update sessions, the
    /model_info rename): the client reads `version` from /server_info (http_server.py 0.5.21 l. 867)
    and refuses a release outside SGLANG_SUPPORTED in one line."""
    assert SGLANG_SUPPORTED == ("0.5.21", "0.5.23")
    for ok in ("0.5.21", "0.5.22", "0.5.23", "0.5.23.post1"):
        check_version(ok)
    for bad in ("0.5.20", "0.5.24", "0.4.6", "", None):
        with pytest.raises(EngineError):
            check_version(bad)
    fake523.reported_version = "0.5.24"
    with pytest.raises(EngineError,
                       match=r"^the SGLang server at http://127.0.0.1:\d+ runs sglang 0.5.24; swerl's "
                                          r"client supports sglang 0.5.21-0.5.23 [^\n]*$"):
        attach(fake523.url)


def test_flush_cache_is_refused_while_requests_run(fake, tok):
    """/flush_cache answers 400 "Flush cache failed." unless the scheduler is idle (http_server.py 0.5.21
    l. 987-1002, Scheduler.flush_cache, scheduler.py l. 5187); `?timeout=` waits for idle
    (flush_wrapper.py l. 31-39), which is what the client's flush_cache() asks for."""
    eng = attach(fake.url)
    fake.gate.clear()  # generations stay "running" until the gate opens
    with ThreadPoolExecutor(1) as ex:
        running = ex.submit(asyncio.run,
                            eng.generate(tok("hi")["input_ids"], SamplingParams(max_new_tokens=2)))
        fake.wait_running(1)
        assert post(fake.url, "/flush_cache") == (400, "Flush cache failed.\n")
        with pytest.raises(EngineError, match=r"/flush_cache: HTTP 400: Flush cache failed."):
            asyncio.run(eng.flush_cache(timeout_s=0.2))
        threading.Timer(0.3, fake.gate.set).start()
        asyncio.run(eng.flush_cache(timeout_s=30))
        assert len(running.result(60).token_ids) == 2 and fake.flushes == 1
    assert fake.requests[-1][1] == "/flush_cache?timeout=30"


def test_weight_update_from_disk_flushes_on_the_server(fake, tok, tmp_path, reference_model):
    """/update_weights_from_disk flushes the prefix cache itself (flush_cache defaults to true,
    io_struct.py 0.5.21 l. 1889; weight_updater.py l. 143): the client sends no /flush_cache of its
    own (which would be refused whenever requests run)."""
    other_dir = make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)
    eng = attach(fake.url)
    prompt = tok("def mean(values):")["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    before = asyncio.run(eng.generate(prompt, greedy))
    asyncio.run(eng.update_weights(other_dir))
    assert eng.weight_version == 1 and fake.flushes == 1
    seen = [(p, b) for _, p, b in fake.requests if p.startswith(("/update_weights", "/flush_cache"))]
    assert seen == [("/update_weights_from_disk", {"model_path": str(other_dir), "weight_version": "1"})]
    info = asyncio.run(eng.model_info())
    assert info["model_path"] == str(other_dir) and info["weight_version"] == "1"
    after = asyncio.run(eng.generate(prompt, greedy))
    assert after.token_ids != before.token_ids
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    assert after.logprobs == pytest.approx(teacher_forced_logprobs(other, prompt, list(after.token_ids)),
                                           abs=2e-4)
    with pytest.raises(EngineError,
                       match="could not load weights from /nonexistent: Failed to get weights iterator"):
        asyncio.run(eng.update_weights("/nonexistent"))
    with pytest.raises(EngineError, match="checkpoint directory"):
        asyncio.run(eng.update_weights(other.state_dict()))


def test_distributed_update_only_inside_a_weight_update_session(fake):
    """Since 0.5.21 /update_weights_from_distributed runs only between /begin_weight_update and
    /end_weight_update (weight_updater.py 0.5.21 l. 179, 0.5.23 l. 192); a second begin, or an end
    without a begin, is refused too (l. 292, l. 306)."""
    body = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[128]]}
    assert post(fake.url, "/update_weights_from_distributed", body) == (
        400, {"success": False,
              "message": "update_weights_from_distributed must run between begin_weight_update() "
                                           "and end_weight_update()"})
    assert post(fake.url, "/end_weight_update", {}) == (
        400,
        {"success": False, "message": "no weight-update session is open; call begin_weight_update() first"})
    assert post(fake.url, "/begin_weight_update", {}) == (200, {"success": True, "message": "Success"})
    assert post(fake.url, "/begin_weight_update", {})[0] == 400
    status, out = post(fake.url, "/update_weights_from_distributed", body)  # in a session, but no group yet
    assert (status == 400
            and out["message"].startswith("Failed to receive weights: Group weight_update_group not in []"))
    assert post(fake.url, "/end_weight_update", {}) == (200, {"success": True, "message": "Success"})


def test_distributed_weight_update_broadcasts_inside_a_session(fake, tok, tmp_path):
    """The whole distributed path on a real gloo group: the server joins the learner's group
    (/init_weights_update_group), then one session per update: begin, the update while the learner
    broadcasts each tensor in names order, end — also when the load fails."""
    import torch
    from transformers import AutoModelForCausalLM

    eng = attach(fake.url)
    port = free_port()
    with ThreadPoolExecutor(1) as ex:
        learner = ex.submit(learner_group, "127.0.0.1", port, 2)
        asyncio.run(eng.init_weights_update_group("127.0.0.1", port, world_size=2, backend="gloo"))
        pg = learner.result(60)
    assert fake.requests[-1][2] == {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
                                    "world_size": 2, "group_name": "weight_update_group", "backend": "gloo"}
    with pytest.raises(ValueError, match="world_size 3"):
        asyncio.run(eng.init_weights_update_group("127.0.0.1", port, world_size=3))
    other = AutoModelForCausalLM.from_pretrained(make_tiny_qwen(tmp_path / "step1", seed=1,
                                                                tokenizer=tok)).eval()
    state = other.state_dict()
    sent = []

    def broadcast(t):
        sent.append(t)
        torch.distributed.broadcast(t, src=0, group=pg)

    start = len(fake.requests)
    asyncio.run(eng.update_weights_from_distributed(state, broadcast))
    assert fake.paths()[start:] == ["/begin_weight_update", "/update_weights_from_distributed",
                                    "/end_weight_update"]
    body = fake.requests[start + 1][2]
    assert (body["names"] == list(state) and set(body["dtypes"]) == {"float32"}
            and body["weight_version"] == "1")
    assert body["shapes"] == [list(t.shape) for t in state.values()]
    assert [t.data_ptr() for t in sent] == [t.data_ptr() for t in state.values()]  # broadcast in names order
    assert eng.weight_version == 1 and fake.flushes == 1 and not fake.session_open
    prompt = tok("def mean(values):")["input_ids"]
    g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5)))
    assert list(g.token_ids) == greedy_reference(other, prompt, 5)  # the server runs the broadcast weights
    with pytest.raises(EngineError,
                       match="could not update weights from the distributed group: Failed to update"):
        asyncio.run(eng.update_weights_from_distributed({"model.norm.weight": torch.zeros(3)}, broadcast))
    assert fake.paths()[-1] == "/end_weight_update" and not fake.session_open and eng.weight_version == 1


# ---- the client's own handling --------------------------------------------------------------------


def test_parse_generate_output_follows_sglangs_shapes():
    ok = {"text": "ab", "output_ids": [5, 7],
          "meta_info": {"finish_reason": {"type": "stop", "matched": 7},
                        "output_token_logprobs": [[-0.5, 5, None], [-1.25, 7, None]]}}
    g = parse_generate_output(ok)
    assert (g.token_ids, g.logprobs, g.finish_reason) == ((5, 7), (-0.5, -1.25), "stop")
    length = {"meta_info": {"finish_reason": {"type": "length", "length": 1},
                            "output_token_logprobs": [[-2.0, 9, "x"]]}}
    assert parse_generate_output(length).finish_reason == "length"
    abort = {"meta_info": {"finish_reason": {"type": "abort", "message": "x"}, "output_token_logprobs": []}}
    assert parse_generate_output(abort).finish_reason == "abort"
    with pytest.raises(EngineError, match="did not return it"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "stop", "matched": 8},
                                             "output_token_logprobs": [[-0.5, 5, None]]}})
    with pytest.raises(EngineError, match="out of the vocabulary"):  # schedule_batch.py 0.5.21 l. 1889-1903
        parse_generate_output({"meta_info": {"finish_reason": {"type": "stop", "matched": "NaN happened"},
                                             "output_token_logprobs": [[-0.5, 5, None]]}})
    with pytest.raises(EngineError, match="return_logprob"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "length"}}})
    assert generate_payload([1, 2], SamplingParams(), 2)["sampling_params"]["n"] == 2


def test_retries_when_the_server_drops_connections(fake523, tok):
    eng = attach(fake523.url, retries=4)
    prompt = tok("hello")["input_ids"]
    fake523.drop_next(2)
    g = asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=3)))
    assert len(g.token_ids) == 3
    assert fake523.paths()[-3:] == ["/generate"] * 3  # two dropped, the third answered
    fake523.drop_next(10)  # the only worker stops answering: it leaves the rotation, and none is left
    with pytest.raises(EngineUnavailable,
                       match=r"^no SGLang server left: http://127.0.0.1:\d+ \(/generate: 4 attempts "
                                                r"over [\d.]+ s, last: RemoteProtocolError"):
        asyncio.run(eng.generate(prompt, SamplingParams(max_new_tokens=3)))


def test_a_clear_error_when_the_server_is_gone(fake523, tok):
    eng = attach(fake523.url, retries=3)
    fake523.stop()
    assert asyncio.run(eng.health()) == {fake523.url: False}
    with pytest.raises(EngineUnavailable,
                       match=rf"^no SGLang server left: {fake523.url} \(/generate: 3 attempts .*"
                                                r"ConnectionRefusedError"):
        asyncio.run(eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    with pytest.raises(EngineError,
                       match=r"http://127.0.0.1:9 not healthy after 1 s — raise the start-up timeout"):
        attach("http://127.0.0.1:9", retries=2, startup_timeout_s=1.0)  # nothing listens


def test_several_servers_round_robin_and_updates_reach_all(tiny_model_dir, tok, tmp_path):
    with FakeSGLangServer(tiny_model_dir, tokenizer=tok) as a, FakeSGLangServer(tiny_model_dir,
                                                                                tokenizer=tok) as b:
        eng = attach(a.url, b.url)
        prompt = tok("hi")["input_ids"]

        async def many():
            return await asyncio.gather(*(eng.generate(prompt, SamplingParams(max_new_tokens=2))
                                          for _ in range(6)))

        assert len(asyncio.run(many())) == 6
        assert a.paths().count("/generate") == 3 and b.paths().count("/generate") == 3
        asyncio.run(eng.flush_cache())
        assert a.flushes == b.flushes == 1
        asyncio.run(eng.update_weights(make_tiny_qwen(tmp_path / "step1", seed=1, tokenizer=tok)))
        assert a.flushes == b.flushes == 2 and a.weight_version == b.weight_version == "1"
        assert eng.generations == 6 and eng.live == (a.url, b.url)
        asyncio.run(eng.close())


def test_launching_a_server_that_cannot_start_says_why(tmp_path):
    cfg = SGLangServerConfig(model_path="/models/none", python=sys.executable, port=39123,
                             startup_timeout_s=60)
    assert launch_command(cfg)[:4] == [sys.executable, "-m", "sglang.launch_server", "--model-path"]
    with pytest.raises(EngineError,
                       match=r"exited with code 1 before becoming healthy(.|\n)*No module named 'sglang'"):
        asyncio.run(SGLangEngine.start(cfg, log_dir=tmp_path))
