"""Evaluation records and reports: the files a run writes, how a resumed run reads them back, and the
summaries (SWE-bench's run report, the agent metrics of a model on SWE tasks, the success rates of a text
game, the `val/` metrics of a training run).

Every file is written atomically (`swerl.files`), so an interrupted evaluation leaves
whole records only and a resumed one can trust what it finds.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swerl.envs.swe.types import GradeResult, SWEInstance
from swerl.eval.types import EvalSample, EvalSummary
from swerl.files import atomic_write

REPORT_SCHEMA_VERSION = 2  # swebench's make_run_report writes this schema


def load_record(path: Path, cls: Any) -> Any:
    """The record of type `cls` saved at `path`, or None when there is none to reuse."""
    if not path.is_file():
        return None
    try:
        return cls.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None  # a torn or foreign file: run or grade it again


def cached_grade(path: Path, sha: str) -> GradeResult | None:
    """The grading saved at `path` when it is a verdict on the patch of hash `sha`."""
    r = load_record(path, GradeResult)
    # a grading that failed (infrastructure) is never reused: only verdicts are
    return r if r is not None and r.patch_sha256 == sha and not r.failed else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al. 2021): the probability that at least one of k
    samples drawn without replacement from n, of which c are correct, is correct:
    1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# ---- SWE-bench's run report (a predictions file, or sample 0 of a model) ------------------------------


def report_dict(summary: EvalSummary, results: dict[str, GradeResult]) -> dict[str, Any]:
    """SWE-bench's run report (same keys as swebench.harness.reporting.make_run_report) + resolve_rate and
    the instances whose test run was forged (`tampered_ids`)."""
    from swebench.harness.infra_failure import TIER_ENVIRONMENT, classify_logs

    reasons: dict[str, str] = {}
    failed_tests: dict[str, list[str]] = {}
    infra: list[str] = []
    ambiguous: list[str] = []
    for iid in (*summary.unresolved_ids, *summary.error_ids):
        r = results[iid]
        if r.test_status:  # the tests ran and were parsed: the reason is in their results
            failed_tests[iid] = list(r.failed_tests)
            reasons[iid] = ("tampered" if r.tampered else "fail_to_pass_failed" if r.fail_to_pass_failure
                            else "pass_to_pass_failed" if r.pass_to_pass_failure else "unresolved")
            continue
        # nothing parsed: swebench's signatures of a broken environment, else no test was collected
        found = classify_logs(r.log_path) if r.log_path else None
        if found and found[0] not in ("no_tests_collected", "tests_timed_out"):
            reasons[iid] = found[0]
            (infra if found[1] == TIER_ENVIRONMENT else ambiguous).append(iid)
        elif r.log_path and Path(r.log_path).is_file():
            timed_out = found is not None and found[0] == "tests_timed_out"
            reasons[iid] = "tests_timed_out" if timed_out else "no_tests_collected"
            ambiguous.append(iid)
    completed = sorted((*summary.resolved_ids, *summary.unresolved_ids))
    return {
        "total_instances": summary.total_instances,
        "submitted_instances": len(summary.submitted_ids),
        "completed_instances": len(completed),
        "resolved_instances": len(summary.resolved_ids),
        "unresolved_instances": len(summary.unresolved_ids),
        "infra_failure_instances": len(infra),
        "ambiguous_failure_instances": len(ambiguous),
        "empty_patch_instances": len(summary.empty_patch_ids),
        "error_instances": len(summary.error_ids),
        "completed_ids": completed,
        "incomplete_ids": list(summary.incomplete_ids),
        "empty_patch_ids": list(summary.empty_patch_ids),
        "submitted_ids": list(summary.submitted_ids),
        "resolved_ids": list(summary.resolved_ids),
        "unresolved_ids": list(summary.unresolved_ids),
        "infra_failure_ids": sorted(infra),
        "ambiguous_failure_ids": sorted(ambiguous),
        "failure_reasons": dict(sorted(reasons.items())),
        # swerl's: per unresolved instance whose tests were parsed, each test that kept it unresolved
        "failed_tests": dict(sorted(failed_tests.items())),
        "error_ids": list(summary.error_ids),
        "failed_instances": len(summary.failed_ids),
        "failed_ids": list(summary.failed_ids),
        "schema_version": REPORT_SCHEMA_VERSION,
        "resolve_rate": summary.resolve_rate,
        # swerl's: unresolved because the canaries caught the test run forged (GradeResult.tampered)
        "tampered_instances": sum(1 for r in results.values() if r.tampered),
        "tampered_ids": sorted(i for i, r in results.items() if r.tampered),
    }


def write_report(summary: EvalSummary, results: dict[str, GradeResult], out: Path, *,
                 extra: dict[str, Any] | None = None, extra_md: Sequence[str] = ()) -> None:
    """report.json (`report_dict` + `extra`) and report.md (+ the `extra_md` lines after the counts)."""
    report = {**report_dict(summary, results), **(extra or {})}
    atomic_write(out / "report.json", json.dumps(report, indent=2) + "\n")
    lines = ["# Evaluation report", "",
             f"**Resolved {report['resolved_instances']} / {report['total_instances']}** "
             f"(resolve rate {100 * report['resolve_rate']:.1f}%)", "",
             "| count | value |", "|---|---|"]
    for k in ("total_instances", "submitted_instances", "completed_instances", "resolved_instances",
              "unresolved_instances", "empty_patch_instances", "error_instances"):
        lines.append(f"| {k} | {report[k]} |")
    lines += list(extra_md)
    lines += ["", "| instance | result | FAIL_TO_PASS ok | PASS_TO_PASS ok | seconds | note |",
              "|---|---|---|---|---|---|"]
    for iid in summary.submitted_ids:
        if iid in summary.empty_patch_ids:
            lines.append(f"| {iid} | empty patch | | | | |")
            continue
        r = results[iid]
        res = "resolved" if r.resolved else ("unresolved" if r.status else "error")
        f2p = f"{len(r.fail_to_pass_success)}/{len(r.fail_to_pass_success) + len(r.fail_to_pass_failure)}"
        p2p = f"{len(r.pass_to_pass_success)}/{len(r.pass_to_pass_success) + len(r.pass_to_pass_failure)}"
        note = r.error.splitlines()[0][:120].replace("|", "\\|") if r.error else ""
        lines.append(f"| {iid} | {res} | {f2p} | {p2p} | {r.total_s:.1f} | {note} |")
    atomic_write(out / "report.md", "\n".join(lines) + "\n")


# ---- a model on SWE tasks: k samples per instance -----------------------------------------------------


def model_report(instances: Sequence[SWEInstance], samples: dict[tuple[str, int], EvalSample], *, k: int,
                 model_name: str,
                 out_dir: str = "") -> tuple[EvalSummary, dict[str, GradeResult], dict[str, Any]]:
    """(SWE-bench summary of sample 0, its per-instance grades, the agent metrics over all k samples).
    pass@k counts every one of the k samples of an instance (a failed episode counts as unresolved);
    the means are over the episodes that ran."""
    ids = [i.instance_id for i in instances]
    first = {iid: samples[(iid, 0)] for iid in ids if (iid, 0) in samples}
    results: dict[str, GradeResult] = {}
    resolved, unresolved, empty, errors = [], [], [], []
    for iid, smp in first.items():
        g = smp.grade or GradeResult(instance_id=iid, resolved=False, reward=0.0,
                                     error=smp.error or "no grade")
        results[iid] = g
        if smp.error:
            errors.append(iid)
        elif g.empty_patch or not smp.model_patch.strip():
            empty.append(iid)
        elif g.resolved:
            resolved.append(iid)
        elif g.status:
            unresolved.append(iid)
        else:
            errors.append(iid)
    summary = EvalSummary(total_instances=len(ids), submitted_ids=tuple(sorted(first)),
                          resolved_ids=tuple(sorted(resolved)), unresolved_ids=tuple(sorted(unresolved)),
                          empty_patch_ids=tuple(sorted(empty)), error_ids=tuple(sorted(errors)),
                          incomplete_ids=tuple(sorted(set(ids) - set(first))), out_dir=out_dir)
    mine = [samples[(iid, s)] for iid in ids for s in range(k) if (iid, s) in samples]
    ran = [x for x in mine if not x.error]
    correct = {iid: sum(samples[(iid, s)].resolved for s in range(k) if (iid, s) in samples) for iid in ids}
    pass_k = {str(j): (mean([pass_at_k(k, correct[iid], j) for iid in ids])) for j in range(1, k + 1)}
    stop_reasons = Counter(x.stop_reason for x in ran)
    trunc = Counter(x.stop_reason for x in ran if x.truncated)
    turns = sum(x.turns for x in ran)
    extra = {
        "model_name_or_path": model_name,
        "k": k,
        "prediction_sample": 0,
        "samples_expected": len(ids) * k,
        "samples_total": len(mine),
        "samples_ran": len(ran),
        "samples_resolved": sum(x.resolved for x in mine),
        "samples_empty_patch": sum(1 for x in ran if not x.model_patch.strip()),
        "sample_errors": sum(1 for x in mine if x.error),
        "sample_error_kinds": dict(sorted(Counter(x.error_kind for x in mine if x.error).items())),
        "pass_at_k": pass_k,
        "instances_resolved_any": sum(1 for c in correct.values() if c),
        "success_rate": mean([float(x.resolved) for x in ran]),
        "mean_reward": mean([x.grade.reward for x in ran if x.grade is not None]),
        "tamper_rate": mean([float(bool(x.grade.tampered_files or x.grade.tampered)) for x in ran
                             if x.grade is not None]),
        "mean_turns": mean([x.turns for x in ran]),
        "mean_tokens": mean([x.generated_tokens for x in ran]),
        "mean_total_tokens": mean([x.total_tokens for x in ran]),
        "mean_tool_calls": mean([x.tool_calls for x in ran]),
        "malformed_rate": sum(x.malformed for x in ran) / turns if turns else 0.0,
        "submitted_rate": mean([float(x.stop_reason == "submit") for x in ran]),
        "stop_reasons": dict(sorted(stop_reasons.items())),
        "truncation_reasons": dict(sorted(trunc.items())),
        "mean_episode_s": mean([x.episode_s for x in ran]),
        "mean_grade_s": mean([x.grade_s for x in ran]),
    }
    return summary, results, extra


def write_model_report(instances: Sequence[SWEInstance], samples: dict[tuple[str, int], EvalSample],
                       out: Path, *, k: int, model_name: str) -> dict[str, Any]:
    """predictions.jsonl (sample 0 of each instance whose episode ran), report.json, report.md."""
    summary, results, extra = model_report(instances, samples, k=k, model_name=model_name, out_dir=str(out))
    lines = []
    for inst in instances:
        smp = samples.get((inst.instance_id, 0))
        if smp is not None and not smp.error:
            lines.append(json.dumps({"instance_id": inst.instance_id, "model_patch": smp.model_patch,
                                     "model_name_or_path": model_name}, ensure_ascii=False) + "\n")
    atomic_write(out / "predictions.jsonl", "".join(lines))
    md = ["", f"Model `{model_name}`, k = {k} samples per instance; the SWE-bench counts above are of "
              "sample 0 (the patch in predictions.jsonl).", "", "| agent metric (all samples) | value |",
          "|---|---|"]
    for key in ("samples_total", "samples_resolved", "sample_errors", "instances_resolved_any"):
        md.append(f"| {key} | {extra[key]} |")
    for j, v in extra["pass_at_k"].items():
        md.append(f"| pass@{j} | {100 * v:.1f}% |")
    for key in ("mean_turns", "mean_tokens", "mean_total_tokens", "mean_tool_calls", "malformed_rate",
                "submitted_rate"):
        md.append(f"| {key} | {extra[key]:.3g} |")
    md.append(f"| truncation_reasons | {json.dumps(extra['truncation_reasons'])} |")
    write_report(summary, results, out, extra=extra, extra_md=md)
    return {**report_dict(summary, results), **extra}


# ---- text games (ALFWorld, WebShop, the puzzles): success rate per group ------------------------------


@dataclasses.dataclass(frozen=True)
class GameEvalSample:
    """One evaluated episode of a text game (a file of the samples folder: `samples/<game>__<k>.json`)."""

    game_id: str
    """The game played."""
    sample: int
    """Index of the episode among the game's k samples."""
    group: str
    """The report group of the game (ALFWorld: its task type)."""
    model_name_or_path: str
    """The model evaluated."""
    won: bool = False
    """The game was won."""
    score: float = 0.0
    """The game's native reward at the end (ALFWorld: 1.0 when won; WebShop: the purchase score)."""
    episode_reward: float = 0.0
    """The shaped episode reward the env paid (ALFWorld: win reward minus invalid-action penalties;
    WebShop: score_scale x the purchase score minus the penalties)."""
    steps: int = 0
    """Actions sent to the game."""
    invalid_actions: int = 0
    """Actions the game did not accept."""
    turns: int = 0
    """Model turns."""
    malformed: int = 0
    """Turns without a well-formed action."""
    stop_reason: str = ""
    """Why the episode ended (won, max_turns, max_context, ...)."""
    truncated: bool = False
    """The episode hit a budget before the game ended."""
    generated_tokens: int = 0
    """Tokens the model generated."""
    episode_s: float = 0.0
    """Seconds the episode took."""
    error: str = ""
    """A harness failure (sandbox, engine, env); empty when the episode ran."""
    error_kind: str = ""
    """The runner's classification of `error`."""
    host: str = ""
    """The cluster's sandbox host the episode ran on (empty on one machine)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> GameEvalSample:
        return cls(**json.loads(text))


def game_report(kind: str, game_ids: Sequence[str], samples: dict[tuple[str, int], GameEvalSample], *, k: int,
                model_name: str) -> dict[str, Any]:
    """Success rate and mean score overall and per group over the samples that ran (a failed episode is
    counted in `sample_errors`, not as a loss), with step and budget statistics."""
    mine = [samples[(g, s)] for g in game_ids for s in range(k) if (g, s) in samples]
    ran = [x for x in mine if not x.error]

    def stats(xs: Sequence[GameEvalSample]) -> dict[str, Any]:
        return {"episodes": len(xs), "won": sum(x.won for x in xs),
                "success_rate": mean([float(x.won) for x in xs]), "mean_score": mean([x.score for x in xs]),
                "mean_steps": mean([x.steps for x in xs])}

    groups = sorted({x.group for x in ran})
    steps = sum(x.steps for x in ran)
    turns = sum(x.turns for x in ran)
    won = {g: sum(samples[(g, s)].won for s in range(k) if (g, s) in samples) for g in game_ids}
    return {
        "kind": kind, "model_name_or_path": model_name, "k": k, "games": len(game_ids),
        "samples_expected": len(game_ids) * k, "samples_ran": len(ran),
        "sample_errors": sum(1 for x in mine if x.error),
        "sample_error_kinds": dict(sorted(Counter(x.error_kind for x in mine if x.error).items())),
        **stats(ran),
        "by_group": {g: stats([x for x in ran if x.group == g]) for g in groups},
        "pass_at_k": {str(j): mean([pass_at_k(k, won[g], j) for g in game_ids]) for j in range(1, k + 1)},
        "mean_episode_reward": mean([x.episode_reward for x in ran]),
        "invalid_action_rate": sum(x.invalid_actions for x in ran) / steps if steps else 0.0,
        "malformed_rate": sum(x.malformed for x in ran) / turns if turns else 0.0,
        "mean_turns": mean([x.turns for x in ran]),
        "mean_tokens": mean([x.generated_tokens for x in ran]),
        "stop_reasons": dict(sorted(Counter(x.stop_reason for x in ran).items())),
        "truncation_reasons": dict(sorted(Counter(x.stop_reason for x in ran if x.truncated).items())),
        "mean_episode_s": mean([x.episode_s for x in ran]),
    }


def write_game_report(kind: str, game_ids: Sequence[str], samples: dict[tuple[str, int], GameEvalSample],
                      out: Path, *, k: int, model_name: str) -> dict[str, Any]:
    """report.json (`game_report`) and report.md."""
    rep = game_report(kind, game_ids, samples, k=k, model_name=model_name)
    atomic_write(out / "report.json", json.dumps(rep, indent=2) + "\n")
    lines = [f"# {kind} evaluation", "", f"Model `{model_name}`, {rep['games']} games, k = {k}: "
             f"**success {100 * rep['success_rate']:.1f}%**, mean score {rep['mean_score']:.3f} "
             f"({rep['samples_ran']} episodes, {rep['sample_errors']} failed)", "",
             "| group | episodes | won | success | mean score | mean steps |", "|---|---|---|---|---|---|"]
    for g, st in rep["by_group"].items():
        lines.append(f"| {g} | {st['episodes']} | {st['won']} | {100 * st['success_rate']:.1f}% | "
                     f"{st['mean_score']:.3f} | {st['mean_steps']:.1f} |")
    lines += ["", "| metric | value |", "|---|---|"]
    for key in ("mean_episode_reward", "invalid_action_rate", "malformed_rate", "mean_turns", "mean_tokens"):
        lines.append(f"| {key} | {rep[key]:.3g} |")
    lines.append(f"| truncation_reasons | {json.dumps(rep['truncation_reasons'])} |")
    atomic_write(out / "report.md", "\n".join(lines) + "\n")
    return rep


def val_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The `val/` metrics of a training run from an evaluation report (SWE: `write_model_report`; games:
    `game_report`; toy: `swerl.eval.episodes.evaluate_toy_async`). Success and means are over the episodes
    that ran; failed episodes are counted in `val/failed`, never as losses; pass@j counts every sample."""
    swe = "mean_reward" in report
    return {
        "val/success_rate": float(report["success_rate"]),
        **{f"val/pass@{j}": float(v) for j, v in report["pass_at_k"].items()},
        "val/reward_mean": float(report["mean_reward"] if swe else report["mean_episode_reward"]),
        "val/turns_mean": float(report["mean_turns"]),
        "val/tokens_mean": float(report["mean_tokens"]),
        "val/episodes": float(report["samples_ran"]),
        "val/failed": float(report["sample_errors"]),
    }
