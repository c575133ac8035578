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
    if args.model:
        print("swerl: error: --model (running an agent on a split, k samples each) arrives with the rollout "
              "engines (swerl/rollout); today `swerl eval` grades a predictions file: --predictions FILE",
              file=sys.stderr)
        return 2
    if not args.predictions:
        print("swerl: error: --predictions FILE is required (a SWE-bench predictions .json or .jsonl)",
              file=sys.stderr)
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

    ev = sub.add_parser("eval", help="grade a SWE-bench predictions file (resolve rate, report.json)")
    _task_selection(ev)
    ev.add_argument("--predictions", help="SWE-bench predictions (.json list or .jsonl of instance_id, "
                                          "model_patch, model_name_or_path)")
    ev.add_argument("--out", default="eval_out", help="report.json, report.md, instances/, logs/ go here")
    ev.add_argument("--workers", type=int, default=1, help="instances graded concurrently")
    ev.add_argument("--timeout", type=float, default=900.0, help="seconds the tests of one instance may run")
    ev.add_argument("--partial-reward", action="store_true",
                    help="report a fractional reward for partially fixed instances")
    ev.add_argument("--model", help="(arrives with the rollout engines) run an agent instead of grading a file")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
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
