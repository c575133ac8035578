"""scripts/diagnostic_energy.py: each group's reference energy over its action and reasoning tokens and its
reward variance, read from `swerl eval`'s trajectory files; the correlation across groups."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import diagnostic_energy as de  # noqa: E402

from swerl.structs import Trajectory  # noqa: E402


def _traj(ids: list[int], span: list[int], reward: float) -> Trajectory:
    n = len(ids)
    mask = [int(s > 0) for s in span]
    turn = [0 if m else -1 for m in mask]
    return Trajectory(tuple(ids), tuple(mask), tuple(span), (0.0,) * n, tuple(turn), 2, True, False, "done",
                      reward=reward)


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).double().eval()


# 8 tokens: every episode in a micro-batch of its own but two of length 4 from different games (nothing
# shared); 10: a__0 and a__1 together, whose common start is fed once (sequence_stats' `prefix`)
@pytest.mark.parametrize("micro_batch_tokens", [8, 10])
def test_group_energies_and_reward_variance_from_eval_trajectories(tmp_path, model, micro_batch_tokens):
    # two groups (games a, b) of two episodes; spans: 0 context, 1 reasoning, 2 action
    trajs = {"a__0": _traj([1, 2, 3, 4, 5], [0, 0, 1, 1, 2], 1.0),
             "a__1": _traj([1, 2, 7, 8], [0, 0, 1, 2], 0.0),
             "b__0": _traj([3, 4, 9, 9, 9, 10], [0, 0, 1, 2, 2, 0], 0.0),
             "b__1": _traj([3, 4, 11, 12], [0, 0, 2, 2], 0.0)}
    (tmp_path / "trajectories").mkdir()
    for name, t in trajs.items():
        (tmp_path / "trajectories" / f"{name}.json").write_text(t.to_json())
    loaded, groups, games, names = de.load_groups(tmp_path)
    assert games == ["a", "b"] and groups == [0, 0, 1, 1] and names == list(trajs)
    temp = 0.7
    per_episode = de.episode_energies(model, loaded, temperature=temp, micro_batch_tokens=micro_batch_tokens)
    assert [len(e) for e in per_episode] == [3, 2, 3, 2]  # one per generated token
    stats = de.group_stats(per_episode, loaded, groups, games)

    # independently: the full logits of each sequence; token t's energy is -logsumexp(z_{t-1} / T)
    def energies(t: Trajectory, kind: int) -> list[float]:
        with torch.no_grad():
            z = model(torch.tensor([t.token_ids])).logits[0].double() / temp
        e = -torch.logsumexp(z, dim=-1)
        return [float(e[i - 1]) for i, s in enumerate(t.span) if s == kind]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else math.nan

    # swerl.algo.diagnostics sums a group's energies in float32: each of <= 6 terms rounds by 2**-24
    # relative, so the mean is within 6 * 2**-24 ~ 3.6e-7 relative; 1e-6 bounds it
    for stat, names in zip(stats, (("a__0", "a__1"), ("b__0", "b__1")), strict=True):
        act = [e for n in names for e in energies(trajs[n], 2)]
        rea = [e for n in names for e in energies(trajs[n], 1)]
        assert stat.action_energy == pytest.approx(mean(act), rel=1e-6)
        assert stat.reasoning_energy == pytest.approx(mean(rea), rel=1e-6)
    # rewards (1, 0): population variance 0.25; (0, 0): 0
    assert [s.game for s in stats] == ["a", "b"]
    assert [s.reward_var for s in stats] == [pytest.approx(0.25), 0.0]
    assert stats[0].rewards == (1.0, 0.0)
    summary = de.summarise(stats, loaded)
    assert summary["groups"] == 2 and summary["episodes"] == 4 and summary["groups_with_reward_variance"] == 1
    assert summary["success_rate"] == pytest.approx(0.25)
    # generated tokens 3 + 2 + 3 + 2 = 10, of which action 1 + 1 + 2 + 2 = 6
    assert summary["action_token_share"] == pytest.approx(0.6)


def test_each_episodes_energies_are_kept_and_not_computed_again(tmp_path, model, monkeypatch):
    model.float().save_pretrained(tmp_path / "ref")
    model.double()
    trajs = [_traj([1, 2, 3, 4, 5], [0, 0, 1, 1, 2], 1.0), _traj([3, 4, 11, 12], [0, 0, 2, 2], 0.0)]
    cache = tmp_path / "energy"
    first = de.cached_energies(str(tmp_path / "ref"), trajs, ["a__0", "b__1"], cache, temperature=1.0,
                               micro_batch_tokens=64, threads=1)
    assert sorted(f.name for f in cache.iterdir()) == ["a__0.json", "b__1.json"]
    import transformers

    def no_load(*a, **k):
        raise AssertionError("the model was loaded although every episode was kept")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    assert de.cached_energies(str(tmp_path / "ref"), trajs, ["a__0", "b__1"], cache, temperature=1.0,
                              micro_batch_tokens=64, threads=1) == first
    with pytest.raises(AssertionError, match="was loaded"):  # another temperature: computed again
        de.cached_energies(str(tmp_path / "ref"), trajs, ["a__0", "b__1"], cache, temperature=0.5,
                           micro_batch_tokens=64, threads=1)
    # the reference retrained into the same directory: its kept energies are stale, computed again
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
    model.float().save_pretrained(tmp_path / "ref")
    model.double()
    with pytest.raises(AssertionError, match="was loaded"):
        de.cached_energies(str(tmp_path / "ref"), trajs, ["a__0", "b__1"], cache, temperature=1.0,
                           micro_batch_tokens=64, threads=1)
    with torch.no_grad():
        model.lm_head.weight.sub_(0.5)


def test_a_directory_without_weights_is_one_line(tmp_path):
    (tmp_path / "ref").mkdir()
    with pytest.raises(RuntimeError, match="no weight files"):
        de.cached_energies(str(tmp_path / "ref"), [_traj([1, 2], [0, 2], 1.0)], ["a__0"], tmp_path / "e",
                           temperature=1.0, micro_batch_tokens=64, threads=1)


def test_correlation_across_groups_with_its_interval():
    # energy rises with reward variance for actions (r = 1 up to rounding), falls for reasoning
    stats = [de.GroupStat(str(i), float(i), -float(i) ** 2, (0.0,), v)
             for i, v in enumerate([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])]
    c = de.correlations(stats)
    assert c["action"]["pearson"] == pytest.approx(1.0) and c["action"]["groups"] == 6
    assert c["action"]["spearman"] == pytest.approx(1.0)
    assert c["reasoning"]["spearman"] == pytest.approx(-1.0) and c["reasoning"]["pearson"] < -0.9
    lo, hi = c["reasoning"]["ci95"]
    assert -1.0 <= lo < c["reasoning"]["pearson"] < hi <= 1.0
    # every group with reward variance 0: the correlation is undefined, not 0
    flat = [de.GroupStat(str(i), float(i), float(i), (0.0,) * 8, 0.0) for i in range(10)]
    c = de.correlations(flat)
    assert math.isnan(c["action"]["pearson"]) and math.isnan(c["action"]["ci95"][0])


def test_the_correlation_over_varying_groups_and_against_mean_reward():
    # groups of 2 episodes: rewards (0, 0), (1, 1), (0, 1), (0, 1), (1, 1); action energies 5, 1, 2, 4, 3
    rewards = [(0.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.0, 1.0), (1.0, 1.0)]
    energy = [5.0, 1.0, 2.0, 4.0, 3.0]
    stats = [de.GroupStat(str(i), e, math.nan, r, 0.25 if r[0] != r[1] else 0.0)
             for i, (e, r) in enumerate(zip(energy, rewards, strict=True))]
    c = de.correlations(stats)["action"]
    # varying groups only: energies 2 and 4 with variance 0.25 both: no spread in variance, undefined
    assert c["varying_groups_only"]["groups"] == 2 and math.isnan(c["varying_groups_only"]["pearson"])
    # vs mean reward (0, 1, 0.5, 0.5, 1): by hand, mean e = 3, mean m = 0.6; deviations e: 2, -2, -1, 1, 0;
    # m: -0.6, 0.4, -0.1, -0.1, 0.4; sum of products -1.2 - 0.8 + 0.1 - 0.1 + 0 = -2.0; sum e^2 = 10,
    # sum m^2 = 0.36 + 0.16 + 0.01 + 0.01 + 0.16 = 0.7: r = -2 / sqrt(7) = -0.7559
    assert c["vs_mean_reward"]["pearson"] == pytest.approx(-2 / math.sqrt(7.0), rel=1e-9)
    assert c["vs_mean_reward"]["groups"] == 5
    # outcomes: lost every time group 0 (energy 5), won every time 1 and 4 (1, 3), mixed 2 and 3 (2, 4)
    by = de.by_outcome(stats)
    assert {k: (v["groups"], v["mean_action_energy"]) for k, v in by.items()} == {
        "all_lost": (1, 5.0), "all_won": (2, 2.0), "mixed": (2, 3.0)}
    assert math.isnan(by["mixed"]["mean_reasoning_energy"])
    # the paper's: energy vs variance (0, 0, .25, .25, 0): deviations v: -.1, -.1, .15, .15, -.1;
    # products -0.2 + 0.2 - 0.15 + 0.15 + 0 = 0: r = 0
    assert c["pearson"] == pytest.approx(0.0, abs=1e-12)


def test_bad_config_is_one_line(tmp_path, capsys):
    # as a user runs it (a process of its own, no traceback), then the other cases through main()
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "diagnostic_energy.py"), "colour=red"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "colour" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for args, words in ((["envs=[chess]", "data=['']"], "not text-game kinds"),
                        (["group_size=1"], "group_size must be >= 2"),
                        (["temperature=0"], "temperature must be > 0"),
                        (["engine=sglang"], "engine must be hf or vllm"),
                        (["engine=vllm"], "engine=vllm needs one")):
        assert de.main(args) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_model_is_one_line(tmp_path, capsys):
    (tmp_path / "frozenlake" / "warm" / "model").mkdir(parents=True)
    for policy, ref in ((f"{tmp_path}/nothing/here", f"{tmp_path}/{{env}}/warm/model"),
                        (f"{tmp_path}/{{env}}/warm/model", f"{tmp_path}/{{env}}/none")):
        args = [f"out={tmp_path}/o", f"policy={policy}", f"references=['{ref}']", "bench_out=''"]
        assert de.main(args) == 1
        err = capsys.readouterr().err
        assert "no model directory" in err and len(err.strip().splitlines()) == 1, err
        assert "nothing/here" in err if "nothing" in policy else "frozenlake/none" in err
        assert "--warm-start-only" in err  # how to make it
        assert not (tmp_path / "o").exists()  # refused before sampling anything


@pytest.mark.slow
def test_the_script_samples_its_groups_continuously_and_measures_them(tmp_path):
    """End to end on a tiny random model (policy and reference): `swerl eval game --continuous` samples 2
    games x 2 episodes, the energy pass reads them, the summary counts them."""
    import json

    from swerl.models import make_tiny_qwen

    model = make_tiny_qwen(tmp_path / "tiny")
    args = [f"out={tmp_path}/o", f"policy={model}", f"references=['{model}']", "groups=2", "group_size=2",
            "max_turns=2", "max_new_tokens=16", "bench_out=''", "envs=[frozenlake]", "data=[size=3]"]
    from swerl.config import load

    cfg = load(de.DiagnosticConfig, None, args)
    cmd = de.eval_command(cfg, "frozenlake", "size=3", str(model), tmp_path / "s")
    assert "--continuous" in cmd and cmd[cmd.index("--k") + 1] == "2" and "--engine" not in cmd
    vllm = de.eval_command(load(de.DiagnosticConfig, None, [*args, "engine=vllm", "engine_url=http://h:1"]),
                           "frozenlake", "size=3", str(model), tmp_path / "s")
    assert vllm[vllm.index("--engine") + 1] == "vllm" and vllm[vllm.index("--engine-url") + 1] == "http://h:1"
    assert "--continuous" not in vllm  # a server batches continuously anyway
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "diagnostic_energy.py"), *args],
                       capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "o" / "diagnostic_energy.json").read_text())
    s = summary["envs"]["frozenlake"]["tiny"]
    assert (s["groups"], s["episodes"]) == (2, 4)
    assert len(list((tmp_path / "o" / "frozenlake" / "samples" / "trajectories").glob("*.json"))) == 4
    # a rerun resumes: no episode sampled again, the finished energy pass read back, the same summary
    kept = tmp_path / "o" / "frozenlake" / "energy" / "tiny" / "train-00000__0.json"
    stamp = kept.stat().st_mtime_ns
    log = tmp_path / "o" / "frozenlake" / "samples" / "eval.log"
    logged = log.stat().st_size
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "diagnostic_energy.py"), *args],
                       capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((tmp_path / "o" / "diagnostic_energy.json").read_text())["envs"]["frozenlake"]["tiny"]
    assert kept.stat().st_mtime_ns == stamp
    assert log.stat().st_size == logged  # every episode was there: no engine started
    assert json.dumps(again["group_values"]) == json.dumps(s["group_values"])  # NaN where a group has none


def test_a_server_serving_another_model_than_the_policy_is_refused(tmp_path, model):
    """engine=vllm: groups sampled from another env's policy would be measured as this env's."""
    import json as _json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    for name in ("policy", "copy", "other"):
        model.float().save_pretrained(tmp_path / name)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    model.float().save_pretrained(tmp_path / "other")  # other weights
    with torch.no_grad():
        model.lm_head.weight.sub_(1.0)
    model.double()
    served = {"root": ""}

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            rows = [{"id": "policy", "root": served["root"]}]
            body = _json.dumps({"object": "list", "data": rows}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        for ok in ("policy", "copy"):  # the same directory, or the same weights elsewhere
            served["root"] = str(tmp_path / ok)
            de.check_served_model(url, str(tmp_path / "policy"))
        served["root"] = str(tmp_path / "other")
        with pytest.raises(RuntimeError, match=r"serves .*other, not this env's policy"):
            de.check_served_model(url, str(tmp_path / "policy"))
    finally:
        server.shutdown()
