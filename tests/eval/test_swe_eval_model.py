"""`swerl eval --model`: an agent (a tiny random Qwen, or a scripted policy) on shipped instances, k
samples each, in real Docker sandboxes with the real tokenizer; predictions.jsonl that `swerl eval
--predictions` accepts, report.json with SWE-bench's keys + pass@k, and resume."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from swe_fixtures import SUITE, pick, swe_suite  # noqa: F401  (fixtures)

from swerl.cli import main
from swerl.envs.swe.types import GradeResult, SWEInstance
from swerl.eval.report import model_report, pass_at_k
from swerl.eval.types import EvalSample

pytestmark = pytest.mark.docker

SWEBENCH_KEYS = {"total_instances", "submitted_instances", "completed_instances", "resolved_instances",
                 "unresolved_instances", "infra_failure_instances", "ambiguous_failure_instances",
                 "empty_patch_instances", "error_instances", "completed_ids", "incomplete_ids",
                 "empty_patch_ids", "submitted_ids", "resolved_ids", "unresolved_ids", "infra_failure_ids",
                 "ambiguous_failure_ids", "failure_reasons", "error_ids", "schema_version"}
AGENT_KEYS = {"resolve_rate", "k", "pass_at_k", "mean_turns", "mean_tokens", "mean_tool_calls",
              "malformed_rate", "truncation_reasons", "stop_reasons", "samples_total", "samples_resolved",
              "sample_errors", "model_name_or_path"}


# ---- the estimator and the report arithmetic (no Docker) -------------------------------------------


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(4, 2, 3) == 1.0  # n - c < k: every draw of 3 holds a correct one
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c / n
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    for bad in ((2, 3, 1), (2, 1, 0), (2, 1, 3), (2, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def _inst(iid: str) -> SWEInstance:
    return SWEInstance(instance_id=iid, repo="a/b", base_commit="0" * 40, patch="", test_patch="",
                       problem_statement="x", fail_to_pass=("t",), pass_to_pass=())


def _smp(iid: str, s: int, *, resolved: bool = False, patch: str = "diff", error: str = "", turns: int = 2,
         tokens: int = 10, stop: str = "max_turns") -> EvalSample:
    grade = None if error else GradeResult(instance_id=iid, resolved=resolved, reward=float(resolved),
                                           status="RESOLVED_FULL" if resolved else "RESOLVED_NO")
    return EvalSample(instance_id=iid, sample=s, model_name_or_path="m", model_patch="" if error else patch,
                      grade=grade, error=error, error_kind="sandbox" if error else "",
                      stop_reason="" if error else stop,
                      truncated=stop != "submit" and not error, turns=0 if error else turns,
                      generated_tokens=0 if error else tokens, malformed=0 if error else 1)


def test_model_report_counts_sample_zero_and_averages_pass_at_k():
    insts = [_inst("a__a-1"), _inst("a__a-2"), _inst("a__a-3")]
    samples = {
        ("a__a-1", 0): _smp("a__a-1", 0, resolved=True, stop="submit"), ("a__a-1", 1): _smp("a__a-1", 1),
        ("a__a-2", 0): _smp("a__a-2", 0, patch=""),
        ("a__a-2", 1): _smp("a__a-2", 1, resolved=True, stop="submit"),
        ("a__a-3", 0): _smp("a__a-3", 0, error="boom"), ("a__a-3", 1): _smp("a__a-3", 1, turns=4, tokens=30),
    }
    summary, _, extra = model_report(insts, samples, k=2, model_name="m")
    assert summary.resolved_ids == ("a__a-1",) and summary.empty_patch_ids == ("a__a-2",)
    assert summary.error_ids == ("a__a-3",) and summary.resolve_rate == pytest.approx(1 / 3)
    # c = 1, 1, 0 of n = 2: pass@1 = mean(0.5, 0.5, 0), pass@2 = mean(1, 1, 0)
    assert extra["pass_at_k"] == {"1": pytest.approx(1 / 3), "2": pytest.approx(2 / 3)}
    assert extra["samples_total"] == 6 and extra["samples_ran"] == 5 and extra["sample_errors"] == 1
    assert extra["mean_turns"] == pytest.approx((2 * 4 + 4) / 5)
    assert extra["mean_tokens"] == pytest.approx((10 * 4 + 30) / 5)
    assert extra["malformed_rate"] == pytest.approx(5 / 12)
    assert extra["truncation_reasons"] == {"max_turns": 3}
    assert extra["stop_reasons"] == {"max_turns": 3, "submit": 2}


# ---- a tiny random model through the CLI, real Docker ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from swerl.models import make_tiny_qwen

    return make_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen"))


def _samples(out):
    return {p.name: EvalSample.from_json(p.read_text()) for p in sorted((out / "samples").iterdir())}


def test_eval_model_reports_predicts_round_trips_and_resumes(tiny_model, base_image, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_model), "--tasks", str(SUITE), "--filter", "six__*", "--limit", "2",
            "--k", "2", "--max-turns", "2", "--max-new-tokens", "16", "--workers", "2", "--seed", "0",
            "--out", str(out), "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err

    samples = _samples(out)
    ids = sorted({s.instance_id for s in samples.values()})
    assert len(ids) == 2 and all(i.startswith("six__") for i in ids)
    assert sorted(samples) == sorted(f"{i}__{s}.json" for i in ids for s in (0, 1))
    assert all(s.ok and s.model_name_or_path == str(tiny_model) for s in samples.values())
    assert all(1 <= s.turns <= 2 and s.generated_tokens <= 2 * 16 for s in samples.values())
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == sorted(samples)

    report = json.loads((out / "report.json").read_text())
    assert set(report) >= SWEBENCH_KEYS | AGENT_KEYS
    assert report["total_instances"] == 2 and report["submitted_instances"] == 2
    assert report["k"] == 2 and report["samples_total"] == 4 and report["sample_errors"] == 0
    first = {s.instance_id: s for s in samples.values() if s.sample == 0}
    resolved0 = sorted(i for i, s in first.items() if s.resolved)
    assert report["resolved_ids"] == resolved0
    assert report["resolve_rate"] == pytest.approx(len(resolved0) / 2)
    assert report["empty_patch_ids"] == sorted(i for i, s in first.items() if not s.model_patch.strip())
    c = {i: sum(s.resolved for s in samples.values() if s.instance_id == i) for i in ids}
    for j in (1, 2):
        assert report["pass_at_k"][str(j)] == pytest.approx(sum(pass_at_k(2, c[i], j) for i in ids) / 2)
    assert report["samples_resolved"] == sum(c.values())
    assert report["mean_turns"] == pytest.approx(sum(s.turns for s in samples.values()) / 4)
    assert report["mean_tokens"] == pytest.approx(sum(s.generated_tokens for s in samples.values()) / 4)
    assert report["mean_tool_calls"] == pytest.approx(sum(s.tool_calls for s in samples.values()) / 4)
    assert sum(report["stop_reasons"].values()) == 4
    assert sum(report["truncation_reasons"].values()) == sum(s.truncated for s in samples.values())
    assert "pass@2" in (out / "report.md").read_text()

    # predictions.jsonl: SWE-bench's fields, sample 0's patch, accepted by `swerl eval --predictions`
    preds = [json.loads(ln) for ln in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2
    for p in preds:
        assert set(p) == {"instance_id", "model_patch", "model_name_or_path"}
        assert p["model_patch"] == first[p["instance_id"]].model_patch
        assert p["model_name_or_path"] == str(tiny_model)
    graded = tmp_path / "graded"
    assert main(["eval", "--predictions", str(out / "predictions.jsonl"), "--tasks", str(SUITE), "--filter",
                 "six__*", "--limit", "2", "--out", str(graded), "--quiet"]) == 0, capsys.readouterr().err
    again = json.loads((graded / "report.json").read_text())
    for key in ("total_instances", "submitted_ids", "resolved_ids", "empty_patch_ids", "resolve_rate"):
        assert again[key] == report[key], key

    # resume: nothing is run again; a missing sample is the only one redone
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "samples").iterdir()}
    assert main(argv) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "samples").iterdir()} == mtimes
    assert json.loads((out / "report.json").read_text()) == report
    gone = f"{ids[1]}__1.json"
    (out / "samples" / gone).unlink()
    assert main(argv) == 0
    after = {p.name: p.stat().st_mtime_ns for p in (out / "samples").iterdir()}
    assert set(after) == set(mtimes)
    assert {n: t for n, t in after.items() if n != gone} == {n: t for n, t in mtimes.items() if n != gone}
    assert json.loads((out / "report.json").read_text())["samples_total"] == 4

    # another model into the same directory is refused, not mixed in
    capsys.readouterr()
    assert main([*argv[:2], f"{tiny_model}/", *argv[3:]]) == 2
    assert "holds samples of model" in capsys.readouterr().err


def test_eval_model_with_an_unreachable_hub_id_fails_clearly(capsys):
    assert main(["eval", "--model", "nobody-here/no-such-model-xyz", "--out", "/nonexistent/out"]) == 2
    assert "nobody-here/no-such-model-xyz" in capsys.readouterr().err  # at once, not after the hub's retries


# ---- a scripted policy: grading, a resolved sample, pass@k with c = 1 of 2 -------------------------


def test_scripted_agent_resolves_one_of_two_samples(swe_suite, base_image, tmp_path):  # noqa: F811
    from swerl.agent import ScriptedEngine, load_tokenizer
    from swerl.agent import tool_call_text as call
    from swerl.envs.swe.tasks import SWETaskConfig, SWETaskSet
    from swerl.eval.episodes import evaluate_async
    from swerl.structs import EpisodeLimits

    inst = pick(swe_suite, "six")
    tok = load_tokenizer()
    apply_gold = call("bash", {"command": f"cd /testbed && git apply - <<'SWERL_EOF'\n{inst.patch}SWERL_EOF"})
    # workers=1: sample 0 runs first (fixes the bug and submits), then sample 1 (never acts)
    engine = ScriptedEngine(tok, [apply_gold, call("submit"), "I am not sure.", "Still not sure."])
    tasks = SWETaskSet(SWETaskConfig(), instances=[inst])
    report = asyncio.run(evaluate_async(tasks, tmp_path, engine=engine, tokenizer=tok, model_name="scripted",
                                              k=2, workers=1, limits=EpisodeLimits(max_turns=2),
                                              progress=False))
    s0 = EvalSample.from_json((tmp_path / "samples" / f"{inst.instance_id}__0.json").read_text())
    s1 = EvalSample.from_json((tmp_path / "samples" / f"{inst.instance_id}__1.json").read_text())
    assert s0.resolved and s0.stop_reason == "submit" and s0.tool_calls == 2
    assert not s1.resolved and s1.truncated and s1.stop_reason == "max_turns" and not s1.model_patch
    assert report["resolved_ids"] == [inst.instance_id] and report["resolve_rate"] == 1.0
    assert report["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(1.0)}
    assert report["samples_resolved"] == 1 and report["truncation_reasons"] == {"max_turns": 1}
    pred = json.loads((tmp_path / "predictions.jsonl").read_text())
    assert pred["model_patch"] == s0.model_patch and s0.model_patch.strip()
