"""The `swerl` command."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table


def _sandbox_build_base(args: argparse.Namespace) -> int:
    from swerl.sandbox.images import build_base_image

    build_base_image(args.tag, method=args.method, force=args.force)
    return 0


def _sandbox_reap(args: argparse.Namespace) -> int:
    from swerl.sandbox.lifecycle import reap

    reaped = reap(run_id=args.run_id, everything=args.all)
    for r in reaped:
        print(f"removed {r.id[:12]} {r.name} (run {r.run_id}): {r.reason}")
    print(f"{len(reaped)} container(s) removed")
    return 0


def _sandbox_ls(args: argparse.Namespace) -> int:
    from swerl.sandbox import lifecycle

    client = lifecycle.docker_client()
    table = Table("id", "image", "run", "owner pid", "status")
    for c in client.containers.list(all=True, filters={"label": f"{lifecycle.LABEL_MANAGED}=1"}):
        table.add_row(c.id[:12], ",".join(c.image.tags) or c.image.id[:19], c.labels.get(lifecycle.LABEL_RUN, ""),
                      c.labels.get(lifecycle.LABEL_PID, ""), c.status)
    Console().print(table)
    return 0


def _sandbox_demo(args: argparse.Namespace) -> int:
    from swerl.demo import run_demo

    run_demo()
    return 0


DEFAULT_TASKS = "tasks/swe/instances.jsonl"


def _load_tasks(args: argparse.Namespace) -> list:
    from swerl.envs.swe.instances import load_instances

    return load_instances(args.tasks, split=args.split, instance_ids=args.instance_ids or None,
                          filters=args.filter or (), limit=args.limit)


def _eval(args: argparse.Namespace) -> int:
    if args.model and args.predictions:
        print("swerl: error: give --model (run an agent, then grade) or --predictions (grade a file), not both",
              file=sys.stderr)
        return 2
    if args.model:
        return _eval_model(args)
    if not args.predictions:
        print("swerl: error: --predictions FILE or --model PATH is required (a SWE-bench predictions .json or "
              ".jsonl to grade, or a model to run on the tasks)", file=sys.stderr)
        return 2
    from swerl.envs.swe.instances import load_predictions
    from swerl.evaluate import evaluate_predictions
    from swerl.structs import GradingConfig

    instances = _load_tasks(args)
    preds = load_predictions(args.predictions)
    if args.split or args.instance_ids or args.filter or args.limit:
        wanted = {i.instance_id for i in instances}
        preds = [p for p in preds if p.instance_id in wanted]
    config = GradingConfig(timeout_s=args.timeout, partial_reward=args.partial_reward)
    s = evaluate_predictions(instances, preds, args.out, workers=args.workers, config=config,
                             progress=not args.quiet)
    print(f"resolved {len(s.resolved_ids)}/{s.total_instances} ({100 * s.resolve_rate:.1f}%); "
          f"unresolved {len(s.unresolved_ids)}, empty {len(s.empty_patch_ids)}, errors {len(s.error_ids)}; "
          f"report: {args.out}/report.json")
    return 0


def _eval_model(args: argparse.Namespace) -> int:
    from swerl.evaluate import check_model_source, evaluate_model
    from swerl.rollout.engine import EngineError
    from swerl.structs import EpisodeLimits, GradingConfig, SamplingParams

    if args.k < 1 or args.workers < 1:
        print(f"swerl: error: --k and --workers must be >= 1 (got {args.k}, {args.workers})", file=sys.stderr)
        return 2
    if args.engine == "hf":
        check_model_source(args.model)  # before loading tasks: a bad --model fails at once
    instances = _load_tasks(args)
    if not instances:
        print("swerl: error: no instances selected (check --split / --filter / --instance-ids)", file=sys.stderr)
        return 2
    try:
        r = evaluate_model(
            instances, args.out, model=args.model, engine=args.engine, engine_url=args.engine_url,
            tokenizer=args.tokenizer, seed=args.seed, k=args.k, workers=args.workers,
            params=SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                  max_new_tokens=args.max_new_tokens),
            limits=EpisodeLimits(max_turns=args.max_turns, max_context_tokens=args.max_context_tokens),
            grading=GradingConfig(timeout_s=args.timeout, partial_reward=args.partial_reward),
            progress=not args.quiet)
    except EngineError as e:
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2
    passk = ", ".join(f"pass@{j} {100 * v:.1f}%" for j, v in r["pass_at_k"].items())
    print(f"sample 0: resolved {r['resolved_instances']}/{r['total_instances']} ({100 * r['resolve_rate']:.1f}%), "
          f"empty {r['empty_patch_instances']}, errors {r['error_instances']}; {r['samples_total']} samples: "
          f"{passk}; mean turns {r['mean_turns']:.2f}, mean tokens {r['mean_tokens']:.1f}; "
          f"predictions: {args.out}/predictions.jsonl, report: {args.out}/report.json")
    return 1 if r["sample_errors"] else 0


def _tasks_list(args: argparse.Namespace) -> int:
    table = Table("instance_id", "split", "repo", "FAIL_TO_PASS", "PASS_TO_PASS")
    instances = _load_tasks(args)
    for i in instances:
        table.add_row(i.instance_id, i.split, i.repo, str(len(i.fail_to_pass)), str(len(i.pass_to_pass)))
    Console().print(table)
    print(f"{len(instances)} instance(s)")
    return 0


def _tasks_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from swerl.envs.swe.generator import generate_library, iter_libraries, write_suite

    out: list = []
    for lib in iter_libraries(args.libraries.split(",") if args.libraries else None):
        out += generate_library(lib, max_instances=args.max_instances, max_candidates=args.max_candidates,
                                seed=args.seed)
        write_suite(out, Path(args.out))  # after every library: a long run keeps what it found
    print(f"{len(out)} instance(s) written to {args.out}/instances.jsonl")
    return 0


def _tasks_validate(args: argparse.Namespace) -> int:
    """The gold patch must resolve and the empty patch must not, for every selected instance."""
    from concurrent.futures import ThreadPoolExecutor

    from swerl.envs.swe.grading import grade_patch

    instances = _load_tasks(args)

    def check(inst):  # type: ignore[no-untyped-def]
        gold = grade_patch(inst, inst.patch)
        empty = grade_patch(inst, "")
        return inst.instance_id, gold, empty

    bad = 0
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for iid, gold, empty in pool.map(check, instances):
            ok = gold.resolved and not empty.resolved and not empty.error
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {iid}: gold {'resolves' if gold.resolved else 'does NOT resolve'}"
                  f"{' (' + gold.error[:200] + ')' if gold.error else ''}; empty patch "
                  f"{'resolves (bad)' if empty.resolved else 'does not resolve'}")
    print(f"{len(instances) - bad}/{len(instances)} instance(s) valid")
    return 1 if bad else 0


def _task_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", default=DEFAULT_TASKS,
                   help="instances: a local .json/.jsonl/.parquet file, a folder with instances.jsonl, "
                        "or a hub dataset id (e.g. SWE-bench/SWE-bench_Verified)")
    p.add_argument("--split", help="hub: dataset split (default test); local files: keep records of this split")
    p.add_argument("--instance-ids", nargs="*", help="keep exactly these instances")
    p.add_argument("--filter", action="append", help="shell pattern on instance_id (repeatable)")
    p.add_argument("--limit", type=int, help="keep the first N instances")


def _train(args: argparse.Namespace) -> int:
    from swerl.config import help_text, load
    from swerl.train import TrainConfig, train

    if args.help_config:
        for key, default, doc in help_text(TrainConfig):
            print(f"{key} = {default}\n    {doc}")
        return 0
    train(load(TrainConfig, args.config, args.overrides))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from swerl.learner.metrics import plot_metrics

    files = plot_metrics(args.run_dir, args.out)
    print(f"{len(files)} plot(s) written to {files[0].parent}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swerl", description="RL for LLM software-engineering agents.")
    sub = p.add_subparsers(dest="command", required=True)

    sb = sub.add_parser("sandbox", help="the Docker sandbox harness").add_subparsers(dest="action", required=True)
    b = sb.add_parser("build-base", help="build the sandbox base image (debootstrap without a registry)")
    b.add_argument("--tag", default="swerl-base:latest")
    b.add_argument("--method", choices=["auto", "debootstrap", "registry"], default="auto",
                   help="auto: an official python image when a registry is reachable, else debootstrap")
    b.add_argument("--force", action="store_true", help="rebuild even if the recipe is unchanged")
    b.set_defaults(fn=_sandbox_build_base)
    r = sb.add_parser("reap", help="remove containers left behind by dead runs")
    r.add_argument("--run-id", help="remove every container of this run, live or not")
    r.add_argument("--all", action="store_true", help="remove every swerl container, live runs included")
    r.set_defaults(fn=_sandbox_reap)
    sb.add_parser("ls", help="list swerl containers").set_defaults(fn=_sandbox_ls)
    sb.add_parser("demo", help="a scripted agent fixes a bug through tool calls in a sandbox").set_defaults(
        fn=_sandbox_demo)

    ev = sub.add_parser("eval", help="grade a SWE-bench predictions file, or run a model on the tasks and grade "
                                     "it (resolve rate, pass@k, report.json)")
    _task_selection(ev)
    ev.add_argument("--predictions", help="SWE-bench predictions (.json list or .jsonl of instance_id, "
                                          "model_patch, model_name_or_path)")
    ev.add_argument("--out", default="eval_out",
                    help="report.json, report.md, instances/ or samples/ + predictions.jsonl, logs/ go here")
    ev.add_argument("--workers", type=int, default=1,
                    help="instances graded (--predictions) or episodes run (--model) concurrently")
    ev.add_argument("--timeout", type=float, default=900.0, help="seconds the tests of one instance may run")
    ev.add_argument("--partial-reward", action="store_true",
                    help="report a fractional reward for partially fixed instances")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    am = ev.add_argument_group("running a model (--model)")
    am.add_argument("--model", help="an HF model directory (or a checkpoint the training loop exported) or a hub "
                                    "id: run the agent on the tasks, --k samples each, and grade every sample")
    am.add_argument("--k", type=int, default=1, help="samples (episodes) per instance; pass@1..k is reported")
    am.add_argument("--engine", choices=["hf", "vllm", "sglang"], default="hf",
                    help="hf: in-process transformers (CPU); vllm/sglang: a server (--engine-url, else launched)")
    am.add_argument("--engine-url", help="attach to this running vLLM/SGLang server")
    am.add_argument("--tokenizer", help="tokenizer directory or hub id (default: the model's, else the bundled Qwen)")
    am.add_argument("--max-turns", type=int, default=30, help="model turns per episode")
    am.add_argument("--max-new-tokens", type=int, default=2048, help="tokens per model turn")
    am.add_argument("--max-context-tokens", type=int, default=32_768, help="tokens per episode")
    am.add_argument("--temperature", type=float, default=1.0)
    am.add_argument("--top-p", type=float, default=1.0)
    am.add_argument("--seed", type=int, help="sampling seed (hf engine)")
    ev.set_defaults(fn=_eval)

    ts = sub.add_parser("tasks", help="SWE task suites").add_subparsers(dest="action", required=True)
    ls = ts.add_parser("list", help="list instances")
    _task_selection(ls)
    ls.set_defaults(fn=_tasks_list)
    va = ts.add_parser("validate", help="check that the gold patch resolves and the empty patch does not")
    _task_selection(va)
    va.add_argument("--workers", type=int, default=2)
    va.set_defaults(fn=_tasks_validate)
    ge = ts.add_parser("generate", help="generate bug-fix instances from the libraries in tasks/swe/sources")
    ge.add_argument("--libraries", help="comma-separated library names (default: all known)")
    ge.add_argument("--max-instances", type=int, default=16, help="instances kept per library")
    ge.add_argument("--max-candidates", type=int, default=70, help="bugs tried per library")
    ge.add_argument("--seed", type=int, default=0)
    ge.add_argument("--out", default="tasks/swe", help="folder for instances.jsonl and splits.json")
    ge.set_defaults(fn=_tasks_generate)
    tr = sub.add_parser("train", help="the RL training loop (YAML config + dotted key=value overrides)")
    tr.add_argument("--config", help="YAML run config, e.g. configs/debug_cpu.yaml")
    tr.add_argument("--help-config", action="store_true", help="list every config key with its help")
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. steps=10 algo.aem.enabled=true")
    tr.set_defaults(fn=_train)
    pl = sub.add_parser("plot", help="PNG curves (reward, loss, entropy, KL, grad norm, action share, energy, "
                                     "ActFocus correlation) from a run's metrics.jsonl")
    pl.add_argument("run_dir", help="a training run directory (holds metrics.jsonl)")
    pl.add_argument("--out", help="folder for the PNG files (default: RUN_DIR/plots)")
    pl.set_defaults(fn=_plot)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from swerl.sandbox.errors import SandboxError

    try:
        return args.fn(args)
    except (SandboxError, ValueError, FileNotFoundError) as e:  # InstanceError is a ValueError
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
