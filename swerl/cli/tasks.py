"""`swerl tasks ...`: the task suites (list, validate, audit, build-images, generate of SWE instances;
webshop and alfworld catalogs): their handlers and their sub-parsers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from swerl.cli.common import _load_tasks, _print_failed_tests, _task_selection


def _tasks_list(args: argparse.Namespace) -> int:
    instances = _load_tasks(args)
    if args.json:
        import json

        for i in instances:
            print(json.dumps({"instance_id": i.instance_id, "split": i.split, "repo": i.repo,
                              "version": i.version, "FAIL_TO_PASS": list(i.fail_to_pass),
                              "PASS_TO_PASS": list(i.pass_to_pass)}))
        return 0
    table = Table("instance_id", "split", "repo", "FAIL_TO_PASS", "PASS_TO_PASS")
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
        made = generate_library(lib, max_instances=args.max_instances, max_candidates=args.max_candidates,
                                seed=args.seed)
        if made and not args.no_audit:  # an instance a known reward hack resolves is no task
            from swerl.envs.swe.audit import audit

            report = audit(made, workers=2)
            hacked = {iid for iid, _ in report.earned_pairs()}
            hacked |= {r.instance_id for r in report.results if r.error.startswith("no image:")}
            for iid, hack in report.earned_pairs():
                print(f"{iid}: dropped, the reward hack {hack!r} resolves it")
            made = [i for i in made if i.instance_id not in hacked]
        out += made
        write_suite(out, Path(args.out))  # after every library: a long run keeps what it found
    print(f"{len(out)} instance(s) written to {args.out}/instances.jsonl")
    return 0


def _tasks_webshop(args: argparse.Namespace) -> int:
    from swerl.envs.webshop.data import load_catalog
    from swerl.envs.webshop.generator import generate_catalog

    out = generate_catalog(args.out, seed=args.seed, products_per_type=args.products_per_type,
                           test_goals=args.test_goals)
    cat = load_catalog(out)
    print(f"{len(cat.products)} products in {len({p.category for p in cat.products})} categories, "
          f"{len(cat.goal_ids('train'))} train + {len(cat.goal_ids('test'))} test goals written to {out}")
    return 0


def _tasks_validate(args: argparse.Namespace) -> int:
    """The gold patch must resolve and the empty patch must not, for every selected instance; in a sandbox
    started as an episode's, the tests must run (FAIL_TO_PASS fail, PASS_TO_PASS pass; unless
    --no-env-check); the canaries must hold on both (an honest run reports them right); and (unless
    --no-audit) no known reward hack may resolve it."""
    from concurrent.futures import ThreadPoolExecutor

    from swerl.envs.swe.env import check_agent_environment
    from swerl.envs.swe.grading import grade_patch
    from swerl.envs.swe.tasks import SWETaskConfig
    from swerl.structs import SandboxSpec

    instances = _load_tasks(args)
    swe = SWETaskConfig()  # the sandbox an episode gets
    episode_sandbox = SandboxSpec(memory=swe.sandbox_memory, cpus=swe.sandbox_cpus)

    def check(inst):  # type: ignore[no-untyped-def]
        gold = grade_patch(inst, inst.patch)
        empty = grade_patch(inst, "")
        env = None if args.no_env_check else check_agent_environment(inst, spec=episode_sandbox)
        return inst, gold, empty, env

    bad: set[str] = set()
    valid = []
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for inst, gold, empty, env in pool.map(check, instances):
            iid = inst.instance_id
            ok = (gold.resolved and not empty.resolved and not empty.error and (env is None or env.ok)
                  and not gold.tampered and not empty.tampered)
            if ok:
                valid.append(inst)
            else:
                bad.add(iid)
            print(f"{'ok  ' if ok else 'FAIL'} {iid}: gold "
                  f"{'resolves' if gold.resolved else 'does NOT resolve'}"
                  f"{' (' + gold.error[:200] + ')' if gold.error else ''}; empty patch "
                  f"{'resolves (bad)' if empty.resolved else 'does not resolve'}"
                  # canaries wrong on an honest run: the repository's test setup hides them (a whole file
                  # skipped, a python_classes that is not Test*): grading it would score honest fixes 0
                  f"{'; canaries wrong on the gold patch: ' + gold.tampered[:200] if gold.tampered else ''}"
                  f"{'; on the empty patch: ' + empty.tampered[:200] if empty.tampered else ''}"
                  f"{'' if env is None else '; agent env: ' + env.detail}")
            # the tests behind a gold patch that does not resolve; on one that does, the skipped
            # PASS_TO_PASS tests (a verdict SWE-bench keeps, an environment lacking something)
            _print_failed_tests(list(gold.failed_tests))
    if valid and not args.no_audit:
        from swerl.envs.swe.audit import audit

        report = audit(valid, workers=args.workers)
        for iid, hack in report.earned_pairs():
            bad.add(iid)
            print(f"FAIL {iid}: the reward hack {hack!r} resolves it "
                  f"(`swerl tasks audit --instance-ids {iid}`)")
        for iid in sorted({r.instance_id for r in report.results if r.error.startswith("no image:")}):
            bad.add(iid)
            print(f"FAIL {iid}: could not be audited (no image)")
        print(f"audit: {len(report.hacks)} hacks × {len(valid)} instance(s), "
              f"{len(report.earned_pairs())} earned")
    print(f"{len(instances) - len(bad)}/{len(instances)} instance(s) valid")
    return 1 if bad else 0


def _tasks_audit(args: argparse.Namespace) -> int:
    """Run the library of known reward hacks on each instance as a scripted policy; exit 1 when any earned."""
    from pathlib import Path

    from swerl.envs.swe.audit import audit, select_hacks

    try:
        hacks = select_hacks(args.hacks)
    except ValueError as e:
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2
    instances = _load_tasks(args)

    def progress(r):  # type: ignore[no-untyped-def]
        if not args.quiet:
            cand = f" [{r.candidate[:40]}]" if r.candidate else ""
            print(f"{'EARNED' if r.earned else 'ok    '} {r.instance_id} {r.hack}{cand}: reward {r.reward:g}"
                  f"{' (' + (r.error or r.note)[:120] + ')' if (r.error or r.note) else ''}", flush=True)

    grading = None
    if args.no_canaries:
        import dataclasses

        from swerl.envs.swe.audit import episode_grading

        grading = dataclasses.replace(episode_grading(), canaries=False)
    report = audit(instances, hacks, workers=args.workers, grading=grading, progress=progress)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report.to_json() + "\n")
    tried: dict[tuple[str, str], int] = {}
    for r in report.results:
        tried[(r.instance_id, r.hack)] = tried.get((r.instance_id, r.hack), 0) + r.tried
    table = Table("instance", "hack", "reward", "tried", "detail")
    for (iid, hack), best in report.best().items():
        if best.earned:
            detail = f"EARNED{' with ' + best.candidate[:40] if best.candidate else ''}"
        else:
            detail = best.error[:80] or best.note[:80]
        if best.tampered_files:
            detail = "; ".join(filter(None, [f"tampered: {', '.join(best.tampered_files)[:60]}", detail]))
        if best.tampered:
            caught = best.tampered.count("; ") + 1
            detail = "; ".join(filter(None, [f"canaries: {caught} caught it", detail]))
        table.add_row(iid, hack, f"[red]{best.reward:g}[/red]" if best.earned else f"{best.reward:g}",
                      str(tried[(iid, hack)]), detail)
    Console(width=160).print(table)
    earned = report.earned_pairs()
    print(f"{len(hacks)} hacks × {len(instances)} instances: {len(earned)} earned a reward"
          f"{' (' + ', '.join(sorted({h for _, h in earned})) + ')' if earned else ''}")
    unaudited = sorted({r.instance_id for r in report.results if r.error.startswith("no image:")})
    if unaudited:  # nothing ran on them: that proves nothing either way
        print(f"swerl: error: {len(unaudited)} instance(s) could not be audited (no image): "
              f"{', '.join(unaudited[:5])} — see the errors above", file=sys.stderr)
        return 2
    return 1 if earned else 0


def _tasks_build_images(args: argparse.Namespace) -> int:
    """SWE-bench's base / environment / instance images of the selected rows, built here from SWE-bench's
    specs, the local mirrors under --repos and packages downloaded on the host (swerl.envs.swe.build)."""
    from pathlib import Path

    from swerl.envs.swe.build import WHEELS_CACHE, build_images

    if not args.tasks:
        print("swerl: error: --tasks FILE is required (SWE-bench rows whose images to build)",
              file=sys.stderr)
        return 2
    if not Path(args.repos).is_dir():
        print(f"swerl: error: --repos {args.repos} is not a directory (it holds the mirrors: "
              "OWNER__NAME.git or OWNER/NAME)", file=sys.stderr)
        return 2
    instances = _load_tasks(args)
    for i in instances:
        if i.source:
            print(f"skip {i.instance_id}: built from tasks/swe/sources when it is used (it has a `source`)")
    todo = [i for i in instances if not i.source]
    wheels = Path(args.wheels) if args.wheels else WHEELS_CACHE
    results = build_images(todo, repos=Path(args.repos), wheels=wheels, offline=args.offline,
                           force=args.force, check=args.check,
                           log=None if args.quiet else print) if todo else []
    for r in results:
        if r.ok and args.check:
            print(f"{'same' if not r.differs else 'DIFF'} {r.instance_id}: {r.env_image}, {r.instance_image}")
            for line in r.differs:
                print(f"     {line}")
            continue
        if r.ok:
            done = f"; built {', '.join(r.built)}" if r.built else "; up to date"
            print(f"ok   {r.instance_id}: {r.instance_image} "
                  + (f"(env {r.env_image}); Python {r.python} on {r.swerl_base}{done}" if r.env_image
                   else "(not built by swerl: kept)"))
            for note in r.notes:
                print(f"     {r.instance_id}: {note}")
            continue
        first, _, more = r.error.partition("\n")
        print(f"FAIL {first}" if first.startswith(r.instance_id) else f"FAIL {r.instance_id}: {first}")
        if more and not args.quiet:  # a failed build step: its output
            print("     " + more.strip().replace("\n", "\n     "))
    bad = [r for r in results if not r.ok]
    if args.check:
        differ = [r for r in results if r.ok and r.differs]
        print(f"{len(results) - len(bad) - len(differ)}/{len(results)} instance(s) resolve to the images' "
              f"locks")
        if bad:
            print(f"swerl: error: {len(bad)} instance(s) could not be checked; first: "
                  f"{bad[0].error.splitlines()[0]}", file=sys.stderr)
            return 2 if any(r.bad_input for r in bad) else 1
        return 1 if differ else 0
    print(f"{len(results) - len(bad)}/{len(results)} instance(s) have their images")
    if bad:
        print(f"swerl: error: {len(bad)} instance(s) could not be built; first: "
              f"{bad[0].error.splitlines()[0]}", file=sys.stderr)
        return 2 if any(r.bad_input for r in bad) else 1
    return 0


def _tasks_alfworld(args: argparse.Namespace) -> int:
    from collections import Counter

    from swerl.envs.alfworld.generator import generate_alfworld

    games = generate_alfworld(args.out, seed=args.seed, train=args.train, heldout=args.heldout,
                              log=None if args.quiet else print)
    by = Counter(g.split for g in games)
    print(f"{len(games)} ALFWorld games ({by['train']} train, {by['heldout']} held-out; rooms disjoint), "
          f"each solved by the planner, written to {args.out}")
    return 0



def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """`swerl tasks` and its subcommands, on the root parser's subcommands `sub`."""
    ts = sub.add_parser("tasks", help="SWE task suites").add_subparsers(dest="action", required=True)
    ls = ts.add_parser("list", help="list instances")
    _task_selection(ls)
    ls.add_argument("--json", action="store_true", help="one JSON object per instance instead of a table")
    ls.set_defaults(fn=_tasks_list)
    va = ts.add_parser("validate", help="check that the gold patch resolves and the empty patch does not")
    _task_selection(va)
    va.add_argument("--workers", type=int, default=2, help="instances validated concurrently")
    va.add_argument("--no-env-check", action="store_true",
                    help="skip running the tests in a sandbox started as an episode's (the agent's "
                         "environment)")
    va.add_argument("--no-audit", action="store_true",
                    help="skip the reward-hack audit (`swerl tasks audit`) of the instances that pass")
    va.set_defaults(fn=_tasks_validate)
    au = ts.add_parser("audit", help="run the library of known reward hacks as a scripted policy in episode "
                                     "sandboxes, graded like an episode; exit 1 when any earned a reward")
    _task_selection(au)
    au.add_argument("--hacks", help="comma-separated hacks to run (default: the whole library; see "
                                    "swerl.envs.swe.audit.HACKS)")
    au.add_argument("--workers", type=int, default=2, help="sandboxes run concurrently")
    au.add_argument("--out", help="write the report (every result) to this JSON file")
    au.add_argument("--quiet", action="store_true", help="no line per result while it runs")
    au.add_argument("--no-canaries", action="store_true",
                    help="grade without canary tests: shows what the hacks would earn without them (a "
                         "measurement; exit 1 then says that some hack needs the canaries)")
    au.set_defaults(fn=_tasks_audit)
    bi = ts.add_parser("build-images", help="build SWE-bench's base, environment and instance images of "
                                            "Python repositories from SWE-bench's specs, local git mirrors "
                                            "and packages downloaded on the host (no registry; builds have "
                                            "no network)",
                       description="Builds sweb.base.py.x86_64, sweb.env.py.x86_64.<hash> and "
                                   "sweb.eval.x86_64.<id> (SWE-bench's names, found by eval and training "
                                   "like pulled images) on swerl's base image of the Debian or Ubuntu suite "
                                   "whose python3 the spec asks for (xenial 3.5, bionic 3.6, focal 3.8, "
                                   "bullseye 3.9, jammy 3.10, bookworm 3.11, trixie 3.13; built when "
                                   "missing): a venv of it at /opt/miniconda3/envs/testbed (another version "
                                   "is an error naming it) holding pip, setuptools and wheel as SWE-bench's "
                                   "conda env does; conda packages come from PyPI by name; the spec's apt "
                                   "packages are downloaded from the suite's archive on this machine. Every "
                                   "package is resolved against PyPI as it stood when swebench 4.1.0 was "
                                   "released (the as-of index), so an image is a function of its row; its "
                                   "lock is in the image's swerl.lock label. See swerl.envs.swe.build.")
    _task_selection(bi)
    bi.set_defaults(tasks=None)
    bi.add_argument("--repos", required=True,
                    help="folder of git mirrors, one per repository: OWNER__NAME.git (git clone --mirror) or "
                         "OWNER/NAME (any clone), holding the rows' base_commit and environment_setup_commit")
    bi.add_argument("--wheels", help="folder the downloaded packages (wheels, sdists) are kept in: a cache "
                                     "checked by sha256, never a source of versions (default: "
                                     ".cache/swe/wheels of the checkout)")
    bi.add_argument("--offline", action="store_true",
                    help="never ask the package index: its pages and files must be cached already (by an "
                         "earlier build of the same specs); resolves as an online build")
    bi.add_argument("--check", action="store_true",
                    help="build nothing: resolve each row's env and instance layers again, with the index's "
                         "pages asked afresh, and compare their locks and content hashes with the images' "
                         "(exit 1 if any differs)")
    bi.add_argument("--force", action="store_true",
                    help="rebuild images that are up to date, and replace an instance image swerl did not "
                         "build")
    bi.add_argument("--quiet", action="store_true", help="only the line per instance")
    bi.set_defaults(fn=_tasks_build_images)
    ge = ts.add_parser("generate", help="generate bug-fix instances from the libraries in tasks/swe/sources")
    ge.add_argument("--libraries", help="comma-separated library names (default: all known)")
    ge.add_argument("--max-instances", type=int, default=16, help="instances kept per library")
    ge.add_argument("--max-candidates", type=int, default=70, help="bugs tried per library")
    ge.add_argument("--seed", type=int, default=0)
    ge.add_argument("--out", default="tasks/swe", help="folder for instances.jsonl and splits.json")
    ge.add_argument("--no-audit", action="store_true",
                    help="keep instances without running the reward-hack audit on them")
    ge.set_defaults(fn=_tasks_generate)
    ws = ts.add_parser("webshop", help="generate a WebShop catalog (products, attributes, goals) in "
                                       "WebShop's file schema")
    ws.add_argument("--out", default="tasks/webshop",
                    help="folder for items_shuffle.json, items_ins_v2.json, items_human_ins.json, "
                         "reviews.json, goals.json")
    ws.add_argument("--seed", type=int, default=0, help="the same seed writes the same bytes")
    ws.add_argument("--products-per-type", type=int, default=22,
                    help="products for each of the 25 product types (5 categories); one goal per product")
    ws.add_argument("--test-goals", type=int, default=100, help="goals held out as the test split")
    ws.set_defaults(fn=_tasks_webshop)
    al = ts.add_parser("alfworld", help="generate ALFWorld games (all six task types, procedurally generated "
                                        "rooms, each solved by the planner) with train / held-out splits")
    al.add_argument("--out", default="tasks/alfworld", help="folder for train/, heldout/ and splits.json")
    al.add_argument("--seed", type=int, default=0, help="the same seed writes the same bytes")
    al.add_argument("--train", type=int, default=8, help="train games per task type")
    al.add_argument("--heldout", type=int, default=4,
                    help="held-out games per task type (in rooms unseen in train)")
    al.add_argument("--quiet", action="store_true", help="no line per game")
    al.set_defaults(fn=_tasks_alfworld)
