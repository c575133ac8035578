"""Evaluation: grade a SWE-bench predictions file and write SWE-bench's report.

`evaluate_predictions` grades every non-empty prediction in a fresh container (`grade_patch`),
`workers` at a time, writes each result to `out/instances/<id>.json` as soon as it is known
(atomically, so an interrupted run resumes where it stopped: results whose patch hash matches are
reused), and then `out/report.json` with the key set of `swebench.harness.reporting.make_run_report`
plus `resolve_rate`, and a Markdown summary `out/report.md`.

`evaluate_model` runs an agent (a model or checkpoint behind a rollout engine) on the instances, `k`
samples (episodes) each, every episode in its own sandbox (`SWEEnv`), `workers` episodes at a time.
Each sample's patch (the submitted one, or the working tree's diff when the episode was truncated)
is graded by SWE-bench's grading in a fresh container while the episode's sandbox is still held, and
written to `out/samples/<id>__<k>.json` (atomically; a resumed run skips samples already there, and
redoes those whose episode failed for a harness reason: image, sandbox, engine). Then:

- `out/predictions.jsonl`: one SWE-bench prediction per instance, the patch of **sample 0** (an
  unbiased single-sample prediction, not the best of k: the official harness scores it as such);
- `out/report.json`: SWE-bench's run-report keys computed on sample 0 (+ `resolve_rate`), and over
  all k samples: `pass_at_k` (the unbiased estimator 1 - C(n-c, k)/C(n, k), averaged over
  instances, for k = 1..K), mean turns / generated tokens / tool calls, malformed-turn rate and
  histograms of stop and truncation reasons; `out/report.md` the same in Markdown;
- `out/trajectories/<id>__<k>.json`: the token-exact trajectory of each sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from swerl.envs.swe.grading import grade_patch, patch_sha256
from swerl.envs.swe.instances import InstanceError
from swerl.rollout.engine import check_model_source
from swerl.structs import (
    EpisodeLimits,
    EvalSample,
    EvalSummary,
    GradeResult,
    GradingConfig,
    Prediction,
    SamplingParams,
    SandboxSpec,
    SWEInstance,
)

REPORT_SCHEMA_VERSION = 2  # swebench's make_run_report writes this schema


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cached(path: Path, sha: str) -> GradeResult | None:
    if not path.is_file():
        return None
    try:
        r = GradeResult.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None  # a torn or foreign file: grade again
    # a grading that failed (infrastructure) is never reused: only verdicts are
    return r if r.patch_sha256 == sha and not r.failed else None


def evaluate_predictions(instances: Sequence[SWEInstance], predictions: Sequence[Prediction], out_dir: str | Path,
                         *, workers: int = 1, config: GradingConfig | None = None, progress: bool = True,
                         client: Any = None, run_id: str | None = None,
                         grade: Callable[..., GradeResult] = grade_patch) -> EvalSummary:
    """Grade `predictions` against `instances`; see the module docstring."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out = Path(out_dir)
    by_id = {i.instance_id: i for i in instances}
    unknown = sorted(p.instance_id for p in predictions if p.instance_id not in by_id)
    if unknown:
        raise InstanceError(f"predictions name instances that are not in the task set: {', '.join(unknown)}")
    preds = {p.instance_id: p for p in predictions}
    empty = sorted(i for i, p in preds.items() if not (p.model_patch or "").strip())
    results: dict[str, GradeResult] = {}
    todo: list[Prediction] = []
    for iid, p in sorted(preds.items()):
        if iid in empty:
            continue
        hit = _cached(out / "instances" / f"{iid}.json", patch_sha256(p.model_patch))
        if hit is not None:
            results[iid] = hit
        else:
            todo.append(p)

    tries = 1 + max(0, (config or GradingConfig()).retries)

    def work(p: Prediction) -> GradeResult:
        for _ in range(tries):  # an infrastructure failure is graded again; a verdict is final
            r = grade(by_id[p.instance_id], p.model_patch, config=config, log_dir=out / "logs", client=client,
                      run_id=run_id)
            if not r.failed:
                break
        _atomic_write(out / "instances" / f"{p.instance_id}.json", r.to_json())
        return r

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), disable=not progress) as bar:
        task = bar.add_task("", total=len(todo))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(work, p): p.instance_id for p in todo}
            for fut in as_completed(futures):
                iid = futures[fut]
                try:
                    results[iid] = fut.result()
                except Exception as e:  # a harness bug on one instance must not lose the others' results
                    results[iid] = GradeResult(instance_id=iid, resolved=False, reward=0.0, failure="harness",
                                               error=f"grading crashed: {type(e).__name__}: {e}")
                    _atomic_write(out / "instances" / f"{iid}.json", results[iid].to_json())
                r = results[iid]
                bar.update(task, advance=1, description=f"{iid}: {'resolved' if r.resolved else r.status or 'error'}")
    summary = EvalSummary(
        total_instances=len(instances), submitted_ids=tuple(sorted(preds)),
        resolved_ids=tuple(sorted(i for i, r in results.items() if r.resolved)),
        unresolved_ids=tuple(sorted(i for i, r in results.items() if not r.resolved and r.status)),
        empty_patch_ids=tuple(empty),
        error_ids=tuple(sorted(i for i, r in results.items() if not r.status)),
        failed_ids=tuple(sorted(i for i, r in results.items() if r.failed)),
        incomplete_ids=tuple(sorted(set(by_id) - set(preds))), out_dir=str(out))
    write_report(summary, results, out)
    return summary


def report_dict(summary: EvalSummary, results: dict[str, GradeResult]) -> dict[str, Any]:
    """SWE-bench's run report (same keys as swebench.harness.reporting.make_run_report) + resolve_rate."""
    from swebench.harness.infra_failure import TIER_ENVIRONMENT, classify_logs

    reasons: dict[str, str] = {}
    infra: list[str] = []
    ambiguous: list[str] = []
    for iid in (*summary.unresolved_ids, *summary.error_ids):
        r = results[iid]
        found = classify_logs(r.log_path) if r.log_path else None
        if found:
            reasons[iid] = found[0]
            (infra if found[1] == TIER_ENVIRONMENT else ambiguous).append(iid)
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
        "error_ids": list(summary.error_ids),
        "failed_instances": len(summary.failed_ids),
        "failed_ids": list(summary.failed_ids),
        "schema_version": REPORT_SCHEMA_VERSION,
        "resolve_rate": summary.resolve_rate,
    }


def write_report(summary: EvalSummary, results: dict[str, GradeResult], out: Path, *,
                 extra: dict[str, Any] | None = None, extra_md: Sequence[str] = ()) -> None:
    """report.json (`report_dict` + `extra`) and report.md (+ the `extra_md` lines after the counts)."""
    report = {**report_dict(summary, results), **(extra or {})}
    _atomic_write(out / "report.json", json.dumps(report, indent=2) + "\n")
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
    _atomic_write(out / "report.md", "\n".join(lines) + "\n")


# ---- evaluating a model: agent episodes, k samples per instance ----------------------------------


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


def sample_path(out: Path, instance_id: str, sample: int) -> Path:
    return out / "samples" / f"{instance_id}__{sample}.json"


def _load_sample(path: Path, cls: Any = None) -> Any:
    """The sample saved at `path` (an EvalSample, or `cls`), or None when there is none to reuse."""
    if not path.is_file():
        return None
    try:
        return (cls or EvalSample).from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None  # a torn or foreign file: run the sample again


def _tokenizer_for(model: str, tokenizer: str | None) -> Any:
    from swerl.agent import load_tokenizer

    if tokenizer:
        return load_tokenizer(tokenizer)
    path = Path(os.path.expanduser(model))
    if path.is_dir() and not (path / "tokenizer_config.json").is_file():
        return load_tokenizer()  # a checkpoint without tokenizer files: the bundled Qwen one
    try:
        return load_tokenizer(os.fspath(path) if path.is_dir() else model)
    except RuntimeError as e:
        raise ValueError(f"could not load the tokenizer of --model {model!r} (pass --tokenizer): {e}") from e


async def open_engine(model: str, *, engine: str = "hf", engine_url: str | None = None, seed: int | None = None,
                      log_dir: str | Path | None = None, startup_timeout_s: float = 600.0,
                      on_wait: Callable[[str], None] | None = None) -> Any:
    """The rollout engine for `model`: `hf` loads it in this process (CPU); `vllm` / `sglang` attach to
    `engine_url` when given, else launch a server on `model`, waiting up to `startup_timeout_s` for it
    (`on_wait` gets a line now and then meanwhile; a URL where nothing listens fails within seconds)."""
    if engine == "hf":
        from swerl.rollout.hf import HFEngine

        if engine_url:
            raise ValueError("--engine-url goes with --engine vllm or sglang (hf runs in this process)")
        return await asyncio.to_thread(HFEngine, model, seed=seed)
    urls = tuple(u.strip().rstrip("/") for u in (engine_url or "").split(",") if u.strip())  # workers, comma-separated
    if engine == "vllm":
        from swerl.rollout.vllm import VLLMEngine
        from swerl.structs import VLLMServerConfig

        return await VLLMEngine.start(VLLMServerConfig(model_path=model, urls=urls, startup_timeout_s=startup_timeout_s),
                                      log_dir=log_dir, on_wait=on_wait)
    if engine == "sglang":
        from swerl.rollout.sglang import SGLangEngine
        from swerl.structs import SGLangServerConfig

        return await SGLangEngine.start(SGLangServerConfig(model_path=model, urls=urls,
                                                           startup_timeout_s=startup_timeout_s),
                                        log_dir=log_dir, on_wait=on_wait)
    raise ValueError(f"unknown engine {engine!r} (hf, vllm or sglang)")


async def _run_sample(inst: SWEInstance, s: int, image: str, *, engine: Any, tokenizer: Any, model_name: str,
                      params: SamplingParams, limits: EpisodeLimits, grading: GradingConfig | None,
                      sandbox: SandboxSpec | None, run_id: str | None, out: Path) -> EvalSample:
    from swerl.agent import run_episode
    from swerl.envs.swe.env import SWEEnv
    from swerl.rollout.engine import EngineError
    from swerl.sandbox import DockerSandbox, SandboxError

    iid = inst.instance_id
    spec = dataclasses.replace(sandbox, image=image) if sandbox else SandboxSpec(image=image)
    sb = DockerSandbox(spec, run_id=run_id)
    t0 = time.monotonic()
    stage = "sandbox"
    try:
        await asyncio.to_thread(sb.start)
        env = SWEEnv(sb, inst, grading=grading, image=image)
        stage = "episode"
        traj = await run_episode(env, engine, tokenizer, params=params, limits=limits)
        t1 = time.monotonic()
        stage = "grading"
        if traj.terminated and env.last_grade is not None:  # submitted: graded when it was submitted
            patch, grade = traj.result or "", env.last_grade
        else:
            patch = traj.result if traj.result is not None else await asyncio.to_thread(sb.diff)
            if not patch.strip():  # SWE-bench does not run empty patches
                grade = GradeResult(instance_id=iid, resolved=False, reward=0.0, empty_patch=True,
                                    patch_sha256=patch_sha256(patch))
            else:
                grade = await asyncio.to_thread(env.grade, traj)  # GradingFailed: no verdict, a failed sample
        t2 = time.monotonic()
    except Exception as e:  # a harness failure: recorded, redone by a resumed run
        kind = (getattr(e, "failure_kind", "") or ("engine" if isinstance(e, EngineError) else "sandbox"
                if isinstance(e, SandboxError) else "grading" if stage == "grading" else "harness"))
        return EvalSample(instance_id=iid, sample=s, model_name_or_path=model_name,
                          error=f"{stage}: {type(e).__name__}: {e}", error_kind=kind,
                          episode_s=time.monotonic() - t0)
    finally:
        await asyncio.to_thread(sb.close)
    _atomic_write(out / "trajectories" / f"{iid}__{s}.json", traj.to_json())
    return EvalSample(instance_id=iid, sample=s, model_name_or_path=model_name, model_patch=patch, grade=grade,
                      stop_reason=traj.stop_reason, truncated=traj.truncated, turns=traj.num_turns,
                      tool_calls=traj.num_tool_calls, malformed=traj.num_malformed, prompt_tokens=traj.prompt_len,
                      generated_tokens=sum(traj.loss_mask), total_tokens=len(traj.token_ids),
                      episode_s=t1 - t0, grade_s=t2 - t1)


async def evaluate_model_async(instances: Sequence[SWEInstance], out_dir: str | Path, *, engine: Any,
                               tokenizer: Any, model_name: str, k: int = 1, workers: int = 1,
                               params: SamplingParams | None = None, limits: EpisodeLimits | None = None,
                               grading: GradingConfig | None = None, sandbox: SandboxSpec | None = None,
                               progress: bool = True, run_id: str | None = None,
                               client: Any = None) -> dict[str, Any]:
    """Run `k` agent samples per instance and grade them; see the module docstring. Returns the
    report (also written to out/report.json). `sandbox`: the agent's sandbox spec (its image is
    replaced by each instance's); default `SandboxSpec()` limits."""
    from swerl.envs.swe.images import resolve_image

    if k < 1 or workers < 1:
        raise ValueError(f"need k >= 1 and workers >= 1, got k={k}, workers={workers}")
    ids = [i.instance_id for i in instances]
    if len(set(ids)) != len(ids):
        raise InstanceError("the task set names an instance twice")
    out = Path(out_dir)
    params = params or SamplingParams()
    limits = limits or EpisodeLimits()
    samples: dict[tuple[str, int], EvalSample] = {}
    todo: list[tuple[SWEInstance, int]] = []
    for inst in instances:
        for s in range(k):
            got = _load_sample(sample_path(out, inst.instance_id, s))
            if got is not None and got.model_name_or_path != model_name:
                raise ValueError(f"{out} holds samples of model {got.model_name_or_path!r}, not {model_name!r}: "
                                 "evaluate another model into another --out directory")
            if got is not None and not got.error:
                samples[(inst.instance_id, s)] = got
            else:
                todo.append((inst, s))

    images: dict[str, str | Exception] = {}
    episode_slots = asyncio.Semaphore(workers)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("samples"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), disable=not progress) as bar:
        task = bar.add_task("", total=len(todo))
        image_lock = asyncio.Lock()
        counts = {"resolved": 0, "failed": 0}

        async def image_of(inst: SWEInstance) -> str | Exception:
            async with image_lock:  # one build at a time; every later sample of the instance reuses it
                if inst.instance_id not in images:
                    try:
                        images[inst.instance_id] = await asyncio.to_thread(resolve_image, inst, client=client)
                    except Exception as e:
                        images[inst.instance_id] = e
                return images[inst.instance_id]

        async def one(inst: SWEInstance, s: int) -> None:
            async with episode_slots:
                image = await image_of(inst)
                if isinstance(image, Exception):
                    r = EvalSample(instance_id=inst.instance_id, sample=s, model_name_or_path=model_name,
                                   error=f"image: {type(image).__name__}: {image}", error_kind="image")
                else:
                    r = await _run_sample(inst, s, image, engine=engine, tokenizer=tokenizer, model_name=model_name,
                                          params=params, limits=limits, grading=grading, sandbox=sandbox,
                                          run_id=run_id, out=out)
            await asyncio.to_thread(_atomic_write, sample_path(out, inst.instance_id, s), r.to_json())
            samples[(inst.instance_id, s)] = r
            counts["resolved"] += r.resolved
            counts["failed"] += bool(r.error)
            note = f"resolved {counts['resolved']}" + (f", failed {counts['failed']}" if counts["failed"] else "")
            bar.update(task, advance=1, description=note)

        await asyncio.gather(*(one(inst, s) for inst, s in todo))

    return write_model_report(instances, samples, out, k=k, model_name=model_name)


def evaluate_model(instances: Sequence[SWEInstance], out_dir: str | Path, *, model: str, engine: str = "hf",
                   engine_url: str | None = None, tokenizer: str | None = None, seed: int | None = None,
                   startup_timeout_s: float = 600.0, **kwargs: Any) -> dict[str, Any]:
    """`evaluate_model_async` with the engine and tokenizer of `model` (an HF directory, a checkpoint
    exported by the training loop, or a hub id when the hub is reachable); the engine is closed after."""
    return _with_model_engine(
        model, out_dir, engine=engine, engine_url=engine_url, tokenizer=tokenizer, seed=seed,
        startup_timeout_s=startup_timeout_s,
        run=lambda eng, tok: evaluate_model_async(instances, out_dir, engine=eng, tokenizer=tok, model_name=model,
                                                  **kwargs))


def _with_model_engine(model: str, out_dir: str | Path, *, engine: str, engine_url: str | None,
                       tokenizer: str | None, seed: int | None, startup_timeout_s: float,
                       run: Callable[[Any, Any], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """`run(engine, tokenizer)` on the engine and tokenizer of `model` (checked first when it runs in
    process); the engine is closed after. Waiting for a server is said on stderr."""
    import sys

    if engine == "hf":
        check_model_source(model)
    tok = _tokenizer_for(model, tokenizer)

    def note(line: str) -> None:
        print(f"swerl: {line}", file=sys.stderr, flush=True)

    async def go() -> dict[str, Any]:
        if engine != "hf":
            note(f"waiting for the {engine} server at {engine_url or 'a launched server'} (up to "
                 f"{startup_timeout_s:.0f} s, --engine-startup-timeout)")
        eng = await open_engine(model, engine=engine, engine_url=engine_url, seed=seed, log_dir=Path(out_dir),
                                startup_timeout_s=startup_timeout_s, on_wait=note)
        try:
            return await run(eng, tok)
        finally:
            await eng.close()

    return asyncio.run(go())


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def model_report(instances: Sequence[SWEInstance], samples: dict[tuple[str, int], EvalSample], *, k: int,
                 model_name: str, out_dir: str = "") -> tuple[EvalSummary, dict[str, GradeResult], dict[str, Any]]:
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
    pass_k = {str(j): (_mean([pass_at_k(k, correct[iid], j) for iid in ids])) for j in range(1, k + 1)}
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
        "success_rate": _mean([float(x.resolved) for x in ran]),
        "mean_reward": _mean([x.grade.reward for x in ran if x.grade is not None]),
        "tamper_rate": _mean([float(bool(x.grade.tampered_files)) for x in ran if x.grade is not None]),
        "mean_turns": _mean([x.turns for x in ran]),
        "mean_tokens": _mean([x.generated_tokens for x in ran]),
        "mean_total_tokens": _mean([x.total_tokens for x in ran]),
        "mean_tool_calls": _mean([x.tool_calls for x in ran]),
        "malformed_rate": sum(x.malformed for x in ran) / turns if turns else 0.0,
        "submitted_rate": _mean([float(x.stop_reason == "submit") for x in ran]),
        "stop_reasons": dict(sorted(stop_reasons.items())),
        "truncation_reasons": dict(sorted(trunc.items())),
        "mean_episode_s": _mean([x.episode_s for x in ran]),
        "mean_grade_s": _mean([x.grade_s for x in ran]),
    }
    return summary, results, extra


def write_model_report(instances: Sequence[SWEInstance], samples: dict[tuple[str, int], EvalSample], out: Path, *,
                       k: int, model_name: str) -> dict[str, Any]:
    """predictions.jsonl (sample 0 of each instance whose episode ran), report.json, report.md."""
    summary, results, extra = model_report(instances, samples, k=k, model_name=model_name, out_dir=str(out))
    lines = []
    for inst in instances:
        smp = samples.get((inst.instance_id, 0))
        if smp is not None and not smp.error:
            lines.append(json.dumps({"instance_id": inst.instance_id, "model_patch": smp.model_patch,
                                     "model_name_or_path": model_name}, ensure_ascii=False) + "\n")
    _atomic_write(out / "predictions.jsonl", "".join(lines))
    md = ["", f"Model `{model_name}`, k = {k} samples per instance; the SWE-bench counts above are of sample 0 "
              "(the patch in predictions.jsonl).", "", "| agent metric (all samples) | value |", "|---|---|"]
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


# ---- text games (ALFWorld, WebShop): success rate per group on held-out games ----------------------
#
# `evaluate_games` runs `k` episodes of an agent on each game (through `swerl.rollout.run_episodes`,
# the game in-process or in a text-game sandbox), writes each sample to `out/samples/<game>__<k>.json`
# as soon as it is known (atomically; a resumed run skips the samples already there and reruns those
# that failed for a harness reason), the trajectories to `out/trajectories/`, and `out/report.json`:
# success rate (won) and mean game score (the game's native reward of the last step: ALFWorld 1.0 on a
# win, WebShop the purchase score), overall and per group (ALFWorld: task type), plus step, invalid-
# action and truncation statistics; `out/report.md` the same in Markdown.


@dataclasses.dataclass(frozen=True)
class GameEvalSample:
    """One evaluated episode of a text game (a line of evaluate_games' samples folder)."""

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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> GameEvalSample:
        return cls(**json.loads(text))


def game_sample_path(out: Path, game_id: str, sample: int) -> Path:
    safe = game_id.strip("/").replace("/", "--")
    return out / "samples" / f"{safe}__{sample}.json"


async def evaluate_games_async(kind: str, game_ids: Sequence[str], out_dir: str | Path, *, engine: Any,
                               tokenizer: Any, model_name: str, game_kwargs: dict[str, Any] | None = None,
                               image: str | None = None, prompt: Any = None, config: Any = None,
                               make_env: Callable[..., Any] | None = None,
                               group_of: Callable[[str], str] = lambda gid: "all", k: int = 1, workers: int = 1,
                               params: SamplingParams | None = None, limits: EpisodeLimits | None = None,
                               sandbox: SandboxSpec | None = None, progress: bool = True,
                               run_id: str | None = None, pools: Any = None) -> dict[str, Any]:
    """Run `k` episodes of the agent behind `engine` on each game of `kind` and report; see the section
    comment. `image`: the text-game image (`swerl.envs.textgame.build_textgame_image()`) to run each
    game in its own sandbox, None to run the games in this process; `pools`: the
    `swerl.sandbox.pool.SandboxPools` the sandboxes come from (the training loop's, kept across its
    steps), default the runner's own for this call. `prompt` / `config`: the
    `TextGamePrompt` / `TextGameConfig` of the env (defaults: the harness's). `make_env(game, game_id,
    prompt, config)`: the env class of the game (default `TextGameEnv`; WebShop's pays for the purchase
    score). `limits.max_turns` is replaced by `config.max_steps`."""
    from swerl.envs.textgame import (
        DEFAULT_PROMPT,
        TextGameConfig,
        TextGameEnv,
        open_game,
    )
    from swerl.rollout.runner import EpisodeSpec, run_episodes

    if k < 1 or workers < 1:
        raise ValueError(f"need k >= 1 and workers >= 1, got k={k}, workers={workers}")
    if len(set(game_ids)) != len(game_ids):
        raise ValueError("the game list names a game twice")
    if not game_ids:
        raise ValueError("no games to evaluate")
    out = Path(out_dir)
    kwargs = dict(game_kwargs or {})
    prompt = prompt or DEFAULT_PROMPT
    config = config or TextGameConfig()
    make_env = make_env or TextGameEnv
    samples: dict[tuple[str, int], GameEvalSample] = {}
    todo: list[tuple[int, str, int]] = []
    for gi, gid in enumerate(game_ids):
        for s in range(k):
            got = _load_sample(game_sample_path(out, gid, s), GameEvalSample)
            if got is not None and got.model_name_or_path != model_name:
                raise ValueError(f"{out} holds samples of model {got.model_name_or_path!r}, not {model_name!r}: "
                                 "evaluate another model into another --out directory")
            if got is not None and not got.error:
                samples[(gid, s)] = got
            else:
                todo.append((gi, gid, s))

    ends: dict[tuple[str, int], TextGameEnv] = {}
    spec_sb = (dataclasses.replace(sandbox, image=image) if sandbox else SandboxSpec(image=image)) if image else None

    def factory(gid: str) -> Callable[[Any], TextGameEnv]:
        return lambda sb: make_env(open_game(kind, sb, **kwargs), gid, prompt, config)

    def finisher(gid: str, s: int) -> Callable[[Any, Any], Any]:
        def finish(env: Any, traj: Any) -> Any:
            ends[(gid, s)] = env  # the runner closes its game after this
            return traj
        return finish

    specs = [EpisodeSpec(task_id=gid, group=gi, sample=s, make_env=factory(gid), sandbox=spec_sb,
                         finish=finisher(gid, s)) for gi, gid, s in todo]
    results = await run_episodes(specs, engine, tokenizer, params=params or SamplingParams(),
                                 limits=config.episode_limits(limits), max_episodes=workers,
                                 progress=progress, run_id=run_id, pools=pools)
    for (_, gid, s), res in zip(todo, results, strict=True):
        env = ends.get((gid, s))
        tr = res.trajectory
        if tr is None or env is None:
            smp = GameEvalSample(game_id=gid, sample=s, group=group_of(gid), model_name_or_path=model_name,
                                 error=res.error or "the episode ended without its environment",
                                 error_kind=res.error_kind or "harness", episode_s=res.stats.wall_s)
        else:
            _atomic_write(out / "trajectories" / game_sample_path(out, gid, s).name, tr.to_json())
            last = env.last
            smp = GameEvalSample(
                game_id=gid, sample=s, group=group_of(gid), model_name_or_path=model_name, won=env.won,
                score=float(last.reward) if last is not None and last.done else 0.0,
                episode_reward=env.total_reward, steps=env.steps, invalid_actions=env.invalid_actions,
                turns=tr.num_turns, malformed=tr.num_malformed, stop_reason=tr.stop_reason, truncated=tr.truncated,
                generated_tokens=sum(tr.loss_mask), episode_s=res.stats.wall_s)
        _atomic_write(game_sample_path(out, gid, s), smp.to_json())
        samples[(gid, s)] = smp
    return write_game_report(kind, game_ids, samples, out, k=k, model_name=model_name)


def game_report(kind: str, game_ids: Sequence[str], samples: dict[tuple[str, int], GameEvalSample], *, k: int,
                model_name: str) -> dict[str, Any]:
    """Success rate and mean score overall and per group over the samples that ran (a failed episode is
    counted in `sample_errors`, not as a loss), with step and budget statistics."""
    mine = [samples[(g, s)] for g in game_ids for s in range(k) if (g, s) in samples]
    ran = [x for x in mine if not x.error]

    def stats(xs: Sequence[GameEvalSample]) -> dict[str, Any]:
        return {"episodes": len(xs), "won": sum(x.won for x in xs),
                "success_rate": _mean([float(x.won) for x in xs]), "mean_score": _mean([x.score for x in xs]),
                "mean_steps": _mean([x.steps for x in xs])}

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
        "pass_at_k": {str(j): _mean([pass_at_k(k, won[g], j) for g in game_ids]) for j in range(1, k + 1)},
        "mean_episode_reward": _mean([x.episode_reward for x in ran]),
        "invalid_action_rate": sum(x.invalid_actions for x in ran) / steps if steps else 0.0,
        "malformed_rate": sum(x.malformed for x in ran) / turns if turns else 0.0,
        "mean_turns": _mean([x.turns for x in ran]),
        "mean_tokens": _mean([x.generated_tokens for x in ran]),
        "stop_reasons": dict(sorted(Counter(x.stop_reason for x in ran).items())),
        "truncation_reasons": dict(sorted(Counter(x.stop_reason for x in ran if x.truncated).items())),
        "mean_episode_s": _mean([x.episode_s for x in ran]),
    }


def write_game_report(kind: str, game_ids: Sequence[str], samples: dict[tuple[str, int], GameEvalSample], out: Path,
                      *, k: int, model_name: str) -> dict[str, Any]:
    """report.json (`game_report`) and report.md."""
    rep = game_report(kind, game_ids, samples, k=k, model_name=model_name)
    _atomic_write(out / "report.json", json.dumps(rep, indent=2) + "\n")
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
    _atomic_write(out / "report.md", "\n".join(lines) + "\n")
    return rep


def evaluate_games(kind: str, game_ids: Sequence[str], out_dir: str | Path, *, model: str, engine: str = "hf",
                   engine_url: str | None = None, tokenizer: str | None = None, seed: int | None = None,
                   startup_timeout_s: float = 600.0, **kwargs: Any) -> dict[str, Any]:
    """`evaluate_games_async` with the engine and tokenizer of `model` (as `evaluate_model`); the engine
    is closed after."""
    return _with_model_engine(
        model, out_dir, engine=engine, engine_url=engine_url, tokenizer=tokenizer, seed=seed,
        startup_timeout_s=startup_timeout_s,
        run=lambda eng, tok: evaluate_games_async(kind, game_ids, out_dir, engine=eng, tokenizer=tok,
                                                  model_name=model, **kwargs))


# ---- the toy game (swerl.learner.toy): every cue k times, the same report keys as a game --------------


async def evaluate_toy_async(engine: Any, cfg: Any, out_dir: str | Path, *, k: int = 1, temperature: float = 1.0,
                             limit: int = 0) -> dict[str, Any]:
    """`k` episodes of each cue of the toy game (`cfg`: its `ToyEnvConfig`; the first `limit` cues, 0:
    all) on `engine`; report.json with the keys of `game_report` that `val_metrics` reads."""
    from swerl.learner.toy import toy_episode

    cues = list(range(cfg.num_cues))[:limit or None]
    trajs = await asyncio.gather(*(toy_episode(engine, cfg, c, temperature=temperature)
                                   for c in cues for _ in range(k)))
    won = [sum(t.reward == 1.0 for t in trajs[i * k:(i + 1) * k]) for i in range(len(cues))]
    rep = {
        "kind": "toy", "games": len(cues), "k": k, "samples_ran": len(trajs), "sample_errors": 0,
        "success_rate": _mean([float(t.reward == 1.0) for t in trajs]),
        "pass_at_k": {str(j): _mean([pass_at_k(k, c, j) for c in won]) for j in range(1, k + 1)},
        "mean_episode_reward": _mean([t.reward or 0.0 for t in trajs]),
        "mean_turns": _mean([t.num_turns for t in trajs]),
        "mean_tokens": _mean([sum(t.loss_mask) for t in trajs]),
    }
    _atomic_write(Path(out_dir) / "report.json", json.dumps(rep, indent=2) + "\n")
    return rep


def val_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The `val/` metrics of a training run from an evaluation report (SWE: `write_model_report`; games:
    `game_report`; toy: `evaluate_toy_async`). Success and means are over the episodes that ran; failed
    episodes are counted in `val/failed`, never as losses; pass@j counts every sample."""
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
