"""The `swerl` command."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from swerl.envs.textgame.tasks import GameOptions
    from swerl.structs import EpisodeLimits


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default (where it has one worth showing)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or action.help is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: defaults in --help."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def _sandbox_build_base(args: argparse.Namespace) -> int:
    from swerl.sandbox.images import build_base_image

    build_base_image(args.tag, suite=args.suite, method=args.method, force=args.force)
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
        table.add_row(c.id[:12], ",".join(c.image.tags) or c.image.id[:19],
                      c.labels.get(lifecycle.LABEL_RUN, ""), c.labels.get(lifecycle.LABEL_PID, ""), c.status)
    Console().print(table)
    return 0


def _sandbox_prune_images(args: argparse.Namespace) -> int:
    from swerl.sandbox.images import prune_images

    pruned = prune_images(dry_run=args.dry_run)
    for p in pruned:
        print(f"{'would remove' if args.dry_run else 'removed'} {p.name} ({p.size / 2**20:.0f} MiB)")
    print(f"{len(pruned)} superseded image(s){' (dry run)' if args.dry_run else ''}")
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


def _eval_predictions(args: argparse.Namespace) -> int:
    """`swerl eval predictions FILE`: SWE-bench's grading of a predictions file."""
    from swerl.envs.swe.instances import load_predictions
    from swerl.eval.predictions import evaluate_predictions
    from swerl.structs import GradingConfig

    instances = _load_tasks(args)
    preds = load_predictions(args.predictions)
    if args.split or args.instance_ids or args.filter or args.limit:
        wanted = {i.instance_id for i in instances}
        preds = [p for p in preds if p.instance_id in wanted]
    config = GradingConfig(timeout_s=args.timeout, partial_reward=args.partial_reward, retries=args.retries)
    s = evaluate_predictions(instances, preds, args.out, workers=args.workers, config=config,
                             progress=not args.quiet)
    if not args.quiet:  # why each unresolved one is: the tests that kept it so (report.json has them all)
        import json
        from pathlib import Path

        report = json.loads((Path(args.out) / "report.json").read_text())
        for iid, reason in report["failure_reasons"].items():
            print(f"unresolved {iid}: {reason}")
            _print_failed_tests(report["failed_tests"].get(iid, []))
    print(f"resolved {len(s.resolved_ids)}/{s.total_instances} ({100 * s.resolve_rate:.1f}%); "
          f"unresolved {len(s.unresolved_ids)}, empty {len(s.empty_patch_ids)}, "
          f"errors {len(s.error_ids) - len(s.failed_ids)}, failed (infrastructure) {len(s.failed_ids)}; "
          f"report: {args.out}/report.json")
    if s.failed_ids:  # no verdict for these: the run is not complete
        print(f"swerl: error: the grading of {len(s.failed_ids)} instance(s) failed for an infrastructure "
              f"reason ({', '.join(s.failed_ids[:5])}) — see {args.out}/instances/<id>.json and rerun; "
              "verdicts are kept",
              file=sys.stderr)
        return 1
    return 0


def _print_failed_tests(lines: list[str], most: int = 8) -> None:
    for line in lines[:most]:
        print(f"     {line}")
    if len(lines) > most:
        print(f"     ... and {len(lines) - most} more")


def _episode_options(args: argparse.Namespace, limits: EpisodeLimits) -> dict[str, object]:
    """The keyword arguments of `swerl.eval.episodes.evaluate(_async)` that `model` and `game` share."""
    from swerl.structs import SamplingParams

    return dict(k=args.k, workers=args.workers, progress=not args.quiet, limits=limits,
                params=SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                      max_new_tokens=args.max_new_tokens))


def _eval_model(args: argparse.Namespace) -> int:
    """`swerl eval model --model PATH`: the agent on SWE tasks, k samples each, every sample graded."""
    from swerl.envs.swe.tasks import SWETaskConfig, SWETaskSet
    from swerl.eval.episodes import evaluate
    from swerl.models import check_model_source
    from swerl.rollout.engine import EngineError
    from swerl.structs import EpisodeLimits

    if args.k < 1 or args.workers < 1:
        print(f"swerl: error: --k and --workers must be >= 1 (got {args.k}, {args.workers})", file=sys.stderr)
        return 2
    if args.engine == "hf":
        check_model_source(args.model)  # before loading tasks: a bad --model fails at once
    instances = _load_tasks(args)
    if not instances:
        print("swerl: error: no instances selected (check --split / --filter / --instance-ids)",
              file=sys.stderr)
        return 2
    tasks = SWETaskSet(SWETaskConfig(grading_timeout_s=args.timeout, partial_reward=args.partial_reward),
                       instances=instances)
    limits = EpisodeLimits(max_turns=args.max_turns, max_context_tokens=args.max_context_tokens)
    try:
        r = evaluate(tasks, args.out, model=args.model, engine=args.engine, engine_url=args.engine_url,
                     startup_timeout_s=args.engine_startup_timeout, tokenizer=args.tokenizer, seed=args.seed,
                     **_episode_options(args, limits))  # type: ignore[arg-type]
    except EngineError as e:
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2
    passk = ", ".join(f"pass@{j} {100 * v:.1f}%" for j, v in r["pass_at_k"].items())
    print(f"sample 0: resolved {r['resolved_instances']}/{r['total_instances']} "
          f"({100 * r['resolve_rate']:.1f}%), "
          f"empty {r['empty_patch_instances']}, errors {r['error_instances']}; {r['samples_total']} samples: "
          f"{passk}; mean turns {r['mean_turns']:.2f}, mean tokens {r['mean_tokens']:.1f}; "
          f"predictions: {args.out}/predictions.jsonl, report: {args.out}/report.json")
    return 1 if r["sample_errors"] else 0


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


def _sandbox_build_textgames(args: argparse.Namespace) -> int:
    from swerl.envs.textgame.image import build_textgame_image

    print(build_textgame_image(log=print if args.verbose else None))
    return 0


def _game_eval_setup(args: argparse.Namespace) -> tuple[list[str], GameOptions, dict[str, list[str]]]:
    """(game ids, how to play them, expert plans by key) for `swerl eval game KIND`."""
    import fnmatch

    from swerl.envs.registry import game_kind
    from swerl.envs.textgame.tasks import GameTaskConfig

    kind, games = game_kind(args.game)
    ids = games.list_games(args.game_data, args.split or kind.heldout_split)
    if args.instance_ids:
        ids = [g for g in ids if g in set(args.instance_ids)]
    for pat in args.filter or ():
        ids = [g for g in ids if fnmatch.fnmatch(g, pat)]
    ids = ids[:args.limit] if args.limit else ids
    plans = games.expert_plans(ids, args.game_data) if args.expert else {}
    return ids, games.options(args.game_data, GameTaskConfig().score_scale), plans


def _in_textgame_image(data: str) -> bool:
    """Whether a game data folder is one the text-game image carries (at the same relative path)."""
    from pathlib import Path

    from swerl.envs.textgame.image import REPO_ROOT, TEXTGAME_DATA_DIRS

    p = Path(data).expanduser()
    p = (p if p.is_absolute() else REPO_ROOT / p).resolve()
    return any(p == (REPO_ROOT / d).resolve() or (REPO_ROOT / d).resolve() in p.parents
               for d in TEXTGAME_DATA_DIRS)


def _eval_game(args: argparse.Namespace) -> int:
    """`swerl eval game KIND`: success rate (and mean score) per group on the held-out games."""
    import asyncio
    import dataclasses

    from swerl.envs.textgame.expert import ExpertEngine
    from swerl.envs.textgame.image import TEXTGAME_DATA_DIRS, build_textgame_image
    from swerl.envs.textgame.tasks import GameTaskSet
    from swerl.eval.episodes import evaluate, evaluate_async
    from swerl.rollout.engine import EngineError
    from swerl.structs import EpisodeLimits

    if bool(args.model) == bool(args.expert):
        print(f"swerl: error: swerl eval game {args.game} needs --model PATH (an agent) or --expert "
              "(the games' expert plans)", file=sys.stderr)
        return 2
    if args.game_data and not args.in_process and not _in_textgame_image(args.game_data):
        print(f"swerl: error: --game-data {args.game_data} is not in the text-game image (it holds "
              f"{', '.join(TEXTGAME_DATA_DIRS)}): add --in-process to play these games in this process",
              file=sys.stderr)
        return 2
    ids, opts, plans = _game_eval_setup(args)
    if not ids:
        print("swerl: error: no games selected (check --split / --filter / --limit)", file=sys.stderr)
        return 2
    image = None if args.in_process else build_textgame_image(log=None if args.quiet else print)
    # the game's own rewards and budget (WebShop: 15 steps, the reward is the purchase score), where
    # the command line does not set them
    given = {"max_steps": args.max_steps, "win_reward": args.win_reward,
             "invalid_penalty": args.invalid_penalty}
    config = dataclasses.replace(opts.config, **{k: v for k, v in given.items() if v is not None})
    tasks = GameTaskSet.of(args.game, ids, dataclasses.replace(opts, config=config), image=image)
    common = _episode_options(args, EpisodeLimits(max_context_tokens=args.max_context_tokens))
    try:
        if args.expert:
            from swerl.agent import load_tokenizer

            tok = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer()
            r = asyncio.run(evaluate_async(tasks, args.out, engine=ExpertEngine(tok, plans), tokenizer=tok,
                                           model_name="expert", **common))  # type: ignore[arg-type]
        else:
            r = evaluate(tasks, args.out, model=args.model, engine=args.engine, engine_url=args.engine_url,
                         startup_timeout_s=args.engine_startup_timeout, tokenizer=args.tokenizer,
                         seed=args.seed, **common)  # type: ignore[arg-type]
    except EngineError as e:
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2
    groups = ", ".join(f"{g} {100 * st['success_rate']:.0f}%" for g, st in r["by_group"].items())
    print(f"{args.game}: success {100 * r['success_rate']:.1f}% ({r['won']}/{r['episodes']}), mean score "
          f"{r['mean_score']:.3f}; {groups}; {r['sample_errors']} failed; report: {args.out}/report.json")
    return 1 if r["sample_errors"] else 0


EVAL_MODES = ("predictions", "model", "game")
"""`swerl eval`'s subcommands."""


def _eval_argv(argv: list[str]) -> list[str]:
    """`argv` with an eval command line of before the subcommands written as the subcommand it meant:
    `eval --predictions FILE ...` → `eval predictions FILE ...`,
    `eval --game KIND ...` → `eval game KIND ...`,
    `eval --model PATH ...` → `eval model --model PATH ...` (the README, configs and scripts of earlier
    releases keep working). Both --model and --predictions: a ValueError naming the two forms."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):  # the global options before the subcommand
        i += 2 if argv[i] in ("--local_rank", "--local-rank") else 1
    if (i >= len(argv) or argv[i] != "eval" or i + 1 >= len(argv)
            or argv[i + 1] in (*EVAL_MODES, "-h", "--help")):
        return argv
    rest = argv[i + 1:]

    def given(flag: str) -> bool:
        return any(a == flag or a.startswith(f"{flag}=") for a in rest)

    def take(flag: str) -> list[str]:
        for j, a in enumerate(rest):
            if a == flag and j + 1 < len(rest):
                value = rest[j + 1]
                del rest[j:j + 2]
                return [value]
            if a.startswith(f"{flag}="):
                del rest[j]
                return [a.split("=", 1)[1]]
        return []  # the flag without its value: argparse says what is missing

    if given("--game"):
        mode = ["game", *take("--game")]
    elif given("--predictions"):
        if given("--model"):
            raise ValueError("give `swerl eval model --model PATH` (run an agent, then grade) or "
                             "`swerl eval predictions FILE` (grade a file), not both")
        mode = ["predictions", *take("--predictions")]
    elif given("--model"):
        mode = ["model"]
    else:
        return argv  # no mode at all: argparse lists the subcommands
    return [*argv[:i + 1], *mode, *rest]


class _RootParser(_Parser):
    """The `swerl` parser: reads the eval command lines of before the subcommands (`_eval_argv`)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            argv = _eval_argv(argv)
        except ValueError as e:
            self.exit(2, f"swerl: error: {e}\n")
        return super().parse_known_args(argv, namespace)


def _task_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", default=DEFAULT_TASKS,
                   help="instances: a local .json/.jsonl/.parquet file, a folder with instances.jsonl, "
                        "or a hub dataset id (e.g. SWE-bench/SWE-bench_Verified)")
    p.add_argument("--split",
                   help="hub: dataset split (default test); local files: keep records of this split")
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
    train(load(TrainConfig, args.config, args.overrides), force_resume=args.force_resume)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The run is saved and the process group destroyed. Skip interpreter teardown, where a
        # DeepSpeed / gloo thread still joinable at exit sometimes aborts the process
        # ("terminate called without an active exception"), which torchrun would report as a failure.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _sft(args: argparse.Namespace) -> int:
    from swerl.config import help_text, load
    from swerl.sft import SFTConfig, sft

    if args.help_config:
        for key, default, doc in help_text(SFTConfig):
            print(f"{key} = {default}\n    {doc}")
        return 0
    sft(load(SFTConfig, args.config, args.overrides))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from swerl.runlog import plot_runs

    out = getattr(args, "out", None)
    if out is None:  # next to the run it describes; several runs belong to none of them
        name = f"dashboard.{args.format}"
        out = Path(args.runs[0]) / "plots" / name if len(args.runs) == 1 else Path(name)
    print(plot_runs(args.runs, out, fmt=args.format, smooth=args.smooth, seeds=args.seeds))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from swerl.runlog import compare_runs, merge_seeds, print_compare, read_runs

    runs = read_runs(args.runs)
    runs = merge_seeds(runs) if args.seeds else runs
    print_compare(compare_runs(runs), runs, json_out=args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from swerl.envs.registry import game_kind_names

    p = _RootParser(prog="swerl", description="RL for LLM software-engineering agents.")
    p.add_argument("--debug", action="store_true", help="on an error, show the traceback too")
    # The `deepspeed` launcher passes --local_rank=N before the subcommand (unless --no_local_rank); the
    # rank is also in $LOCAL_RANK, which is what swerl.learner.dist reads.
    p.add_argument("--local_rank", "--local-rank", type=int, dest="local_rank", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command")

    sb = sub.add_parser("sandbox", help="the Docker sandbox harness").add_subparsers(
        dest="action", required=True)
    b = sb.add_parser("build-base", help="build the sandbox base image (debootstrap without a registry)")
    b.add_argument("--suite", default="bookworm",
                   help="Debian or Ubuntu suite (its python3): xenial (3.5), bionic (3.6), focal (3.8), "
                        "bullseye (3.9), jammy (3.10), bookworm (3.11), trixie (3.13); Ubuntu's need "
                        "ubuntu-keyring; "
                        "`tasks build-images` builds the one a spec's Python needs itself")
    b.add_argument("--tag", help="default: swerl-base:latest for bookworm, swerl-base-SUITE:latest otherwise")
    b.add_argument("--method", choices=["auto", "debootstrap", "registry"], default="auto",
                   help="auto: an official python image when a registry is reachable, else debootstrap")
    b.add_argument("--force", action="store_true", help="rebuild even if the recipe is unchanged")
    b.set_defaults(fn=_sandbox_build_base)
    r = sb.add_parser("reap", help="remove containers left behind by dead runs")
    r.add_argument("--run-id", help="remove every container of this run, live or not")
    r.add_argument("--all", action="store_true", help="remove every swerl container, live runs included")
    r.set_defaults(fn=_sandbox_reap)
    sb.add_parser("ls", help="list swerl containers").set_defaults(fn=_sandbox_ls)
    pi = sb.add_parser("prune-images", help="remove superseded swerl images (older content-hash tags of a "
                                            "repository, untagged leftovers); images in use are kept")
    pi.add_argument("--dry-run", action="store_true", help="list what would be removed")
    pi.set_defaults(fn=_sandbox_prune_images)
    sb.add_parser("demo", help="a scripted agent fixes a bug through tool calls in a sandbox").set_defaults(
        fn=_sandbox_demo)
    bt = sb.add_parser("build-textgames", help="build the text-game image (ALFWorld, WebShop: wheels "
                                               "installed offline, game data); cached by content hash")
    bt.add_argument("--verbose", action="store_true", help="show the build log")
    bt.set_defaults(fn=_sandbox_build_textgames)

    ev = sub.add_parser("eval", help="evaluate: grade a SWE-bench predictions file, or run a model (or a "
                                     "game's expert) on held-out tasks (resolve rate, pass@k, report.json)")
    modes = ev.add_subparsers(dest="mode", required=True, metavar="{" + ",".join(EVAL_MODES) + "}")

    def common(m: argparse.ArgumentParser, *, workers: str) -> None:
        m.add_argument("--out", default="eval_out",
                       help="report.json, report.md, instances/ or samples/ (+ predictions.jsonl, "
                            "trajectories/), logs/ go here; a rerun into the same folder resumes")
        m.add_argument("--workers", type=int, default=1, help=workers)
        m.add_argument("--quiet", action="store_true", help="no progress bar")

    def swe_grading(m: argparse.ArgumentParser) -> None:
        m.add_argument("--timeout", type=float, default=1800.0,
                       help="seconds the tests of one instance may run (SWE-bench's harness default)")
        m.add_argument("--partial-reward", action="store_true",
                       help="report a fractional reward for partially fixed instances")

    def agent(m: argparse.ArgumentParser, *, model_help: str, required: bool) -> argparse._ArgumentGroup:
        am = m.add_argument_group("the agent")
        am.add_argument("--model", required=required, help=model_help)
        am.add_argument("--k", type=int, default=1, help="samples (episodes) per task; pass@1..k is reported")
        am.add_argument("--engine", choices=["hf", "vllm", "sglang"], default="hf",
                        help="hf: in-process transformers (CPU); vllm/sglang: a server (--engine-url, else "
                             "launched)")
        am.add_argument("--engine-url",
                        help="attach to these running vLLM/SGLang servers (comma-separated URLs)")
        am.add_argument("--engine-startup-timeout", type=float, default=600.0,
                        help="seconds to wait for a launched (or starting) vLLM/SGLang server to become "
                             "healthy")
        am.add_argument("--tokenizer",
                        help="tokenizer directory or hub id (default: the model's, else the bundled Qwen)")
        am.add_argument("--max-new-tokens", type=int, default=2048, help="tokens per model turn")
        am.add_argument("--max-context-tokens", type=int, default=32_768, help="tokens per episode")
        am.add_argument("--temperature", type=float, default=1.0)
        am.add_argument("--top-p", type=float, default=1.0)
        am.add_argument("--seed", type=int, help="sampling seed (hf engine)")
        return am

    pr = modes.add_parser("predictions",
                          help="grade a SWE-bench predictions file (resolve rate, report.json)")
    pr.add_argument("predictions", metavar="FILE", help="SWE-bench predictions (.json list or .jsonl of "
                                                        "instance_id, model_patch, model_name_or_path)")
    _task_selection(pr)
    common(pr, workers="instances graded concurrently")
    swe_grading(pr)
    pr.add_argument("--retries", type=int, default=2,
                    help="gradings more of an instance whose grading failed for an infrastructure reason")
    pr.set_defaults(fn=_eval_predictions)

    mo = modes.add_parser("model", help="run a model on SWE tasks, --k samples each, and grade every sample "
                                        "(pass@k, predictions.jsonl of sample 0)")
    _task_selection(mo)
    common(mo, workers="episodes run concurrently")
    swe_grading(mo)
    am = agent(mo, model_help="an HF model directory (or a checkpoint the training loop exported) or a "
                              "hub id", required=True)
    am.add_argument("--max-turns", type=int, default=30, help="model turns per episode")
    mo.set_defaults(fn=_eval_model)

    ga = modes.add_parser("game",
                          help="success rate (and mean score) per group on a text game's held-out games")
    ga.add_argument("game", metavar="KIND", choices=game_kind_names(),
                    help=f"the text game: {', '.join(game_kind_names())}")
    ga.add_argument("--split", help="the games' split (default: the kind's held-out one)")
    ga.add_argument("--instance-ids", nargs="*", help="keep exactly these games")
    ga.add_argument("--filter", action="append", help="shell pattern on the game id (repeatable)")
    ga.add_argument("--limit", type=int, help="keep the first N games")
    common(ga, workers="episodes run concurrently")
    agent(ga, model_help="the agent: an HF model directory, an exported checkpoint or a hub id (or --expert)",
          required=False)
    tg = ga.add_argument_group("the games")
    tg.add_argument("--expert", action="store_true", help="play the games' expert plans instead of a model "
                                                         "(checks the harness: should win every game)")
    tg.add_argument("--game-data", help="the game's data folder (default: the shipped set under tasks/; "
                                        "ALFWorld: or $ALFWORLD_DATA/json_2.1.1 with --split valid_unseen)")
    tg.add_argument("--in-process", action="store_true",
                    help="play the games in this process instead of in text-game sandboxes")
    tg.add_argument("--max-steps", type=int, help="actions per episode (default: the game's; ALFWorld 50, "
                                                  "WebShop 15 as in verl-agent)")
    tg.add_argument("--win-reward", type=float, help="episode reward added for a win (default: ALFWorld 10; "
                                                      "WebShop 0, its reward is 10 x the purchase score)")
    tg.add_argument("--invalid-penalty", type=float, help="subtracted per inadmissible action (default 0.1)")
    ga.set_defaults(fn=_eval_game)

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
    tr = sub.add_parser("train", help="the RL training loop (YAML config + dotted key=value overrides)")
    tr.add_argument("--config", help="YAML run config, e.g. configs/debug_cpu.yaml")
    tr.add_argument("--help-config", action="store_true", help="list every config key with its help")
    tr.add_argument("--force-resume", action="store_true",
                    help="continue a run directory whose saved config has another model, env or algorithm")
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. steps=10 algo.aem.enabled=true")
    tr.set_defaults(fn=_train)
    sf = sub.add_parser("sft", help="warm start: a model trained on a text game's expert play (its solver's "
                                    "plans, with reasoning), evaluated on held-out games; "
                                    "`swerl train model.path=OUT/model`")
    sf.add_argument("--config", help="YAML config, e.g. configs/sft_sokoban.yaml")
    sf.add_argument("--help-config", action="store_true", help="list every config key with its help")
    sf.add_argument("overrides", nargs="*", help="dotted overrides, e.g. epochs=6 train_games=512")
    sf.set_defaults(fn=_sft)
    pl = sub.add_parser("plot", help="one dashboard figure (reward, val, entropy, length, AEM, ActFocus, KL, "
                                     "time) of one or more runs' metrics.jsonl, runs overlaid",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    pl.add_argument("runs", nargs="+", metavar="RUN",
                    help="training run directories (each holds metrics.jsonl)")
    # SUPPRESS: the default depends on the runs, and the help formatter would print "None"
    pl.add_argument("--out", default=argparse.SUPPRESS,
                    help="figure file (default: RUN/plots/dashboard.FORMAT for one run, ./dashboard.FORMAT "
                         "for several)")
    pl.add_argument("--format", choices=["png", "svg"], default="png", help="figure file format")
    pl.add_argument("--smooth", type=float, default=0.6,
                    help="EMA weight of the smoothed curves, in [0, 1) (0: raw values only)")
    seeds_help = ("runs whose directories differ only in a seed (ARM/seed0, ARM/seed1 or ARM-s0, ARM-s1) as "
                  "one arm: the mean over its seeds (plot: with the min-max band shaded)")
    pl.add_argument("--seeds", action="store_true", help=seeds_help)
    pl.set_defaults(fn=_plot)
    cm = sub.add_parser("compare", help="final and best value of the headline metrics of one or more runs",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cm.add_argument("runs", nargs="+", metavar="RUN",
                    help="training run directories (each holds metrics.jsonl)")
    cm.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cm.add_argument("--seeds", action="store_true", help=seeds_help)
    cm.set_defaults(fn=_compare)
    return p


_HINTS: tuple[tuple[str, str], ...] = (
    # (exception class name in the MRO, what to do) for errors whose message does not say it
    ("ConfigError", "see `swerl {command} --help-config` for every key"),
    ("InstanceError", "check the task file (`swerl tasks list --tasks FILE` shows what is there)"),
    ("EngineUnavailable", "start the inference server, or fix --engine-url / rollout.<engine>.urls"),
    ("EngineError", "check the inference server (its log is in the run or --out directory)"),
    ("ImageUnavailable", "see `swerl sandbox build-base` and the task's image"),
    ("SandboxError", "check Docker (`docker info`; scripts/ensure_docker.sh starts it)"),
    ("FileNotFoundError", "check the path"),
)


def error_line(e: BaseException, command: str = "train") -> str:
    """`swerl: error: <what> — <what to do>`, on one line: the message's first line, plus a hint where
    the message does not already say what to do (`command`: the subcommand whose config it is)."""
    lines = str(e).strip().splitlines() or [type(e).__name__]
    what = lines[0].strip()
    if " — " not in what:
        names = {k.__name__ for k in type(e).__mro__}
        hint = next((h for name, h in _HINTS if name in names), "").replace(
            "{command}", command if command in ("train", "sft") else "train")
        what = f"{what} — {hint}" if hint else what
    more = " (more: --debug)" if len(lines) > 1 else ""
    return f"swerl: error: {what}{more}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    from swerl.rollout.engine import EngineError
    from swerl.sandbox.errors import SandboxError

    # expected errors (bad input, an unreachable server or daemon, a missing image): one line, exit 2
    try:
        return args.fn(args)
    except (SandboxError, EngineError, ValueError, FileNotFoundError, NotADirectoryError) as e:
        if args.debug:
            import traceback

            traceback.print_exc()
        print(error_line(e, args.command), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swerl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
