"""`swerl eval predictions | model | game`: grading a SWE-bench predictions file, running a model (or a
text game's expert) on held-out tasks; its handlers, its sub-parsers, and the rewriting of the eval
command lines of before the subcommands (`_eval_argv`, which the root parser applies)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from swerl.cli.common import _load_tasks, _print_failed_tests, _task_selection

if TYPE_CHECKING:
    from swerl.envs.textgame.tasks import GameOptions
    from swerl.structs import EpisodeLimits


def _eval_predictions(args: argparse.Namespace) -> int:
    """`swerl eval predictions FILE`: SWE-bench's grading of a predictions file."""
    from swerl.envs.swe.instances import load_predictions
    from swerl.envs.swe.types import GradingConfig
    from swerl.eval.predictions import evaluate_predictions

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



def _episode_options(args: argparse.Namespace, limits: EpisodeLimits) -> dict[str, object]:
    """The keyword arguments of `swerl.eval.episodes.evaluate(_async)` that `model` and `game` share."""
    from swerl.structs import SamplingParams

    return dict(k=args.k, workers=args.workers, progress=not args.quiet, limits=limits,
                params=SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                      max_new_tokens=args.max_new_tokens))


def _places(args: argparse.Namespace) -> Any:
    """Where the episodes run: this machine (nothing to open), or the sandbox hosts of the Ray cluster at
    `--ray-address` (`swerl.cluster.Fleet`, a context manager to enter)."""
    import contextlib

    if not args.ray_address:
        return contextlib.nullcontext()
    from swerl.cluster import ClusterConfig, Fleet, RayConfig
    from swerl.sandbox import lifecycle

    return Fleet(ClusterConfig(backend="ray", ray=RayConfig(address=args.ray_address)),
                 run_id=lifecycle.default_run_id(), warm=min(args.workers, 8),
                 log=None if args.quiet else print)


def _check_engine_flags(args: argparse.Namespace) -> None:
    """Bad engine flags (`--engine-url` with hf, `--continuous` with a server): one line, before any work."""
    from swerl.eval.model import engine_config

    engine_config(args.engine, engine_url=args.engine_url, continuous=args.continuous,
                  python=args.engine_python)


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
    from swerl.models.shipped import SHIPPED

    _check_engine_flags(args)
    if args.engine == "hf" and args.model not in SHIPPED:
        check_model_source(args.model)  # before loading tasks: a bad --model fails at once
    instances = _load_tasks(args)
    if not instances:
        print("swerl: error: no instances selected (check --split / --filter / --instance-ids)",
              file=sys.stderr)
        return 2
    tasks = SWETaskSet(SWETaskConfig(grading_timeout_s=args.timeout, partial_reward=args.partial_reward),
                       instances=instances)
    limits = EpisodeLimits(max_turns=args.max_turns, max_context_tokens=args.max_context_tokens)
    from swerl.sandbox.errors import SandboxError

    try:
        with _places(args) as pools:
            r = evaluate(tasks, args.out, model=args.model, engine=args.engine, engine_url=args.engine_url,
                         engine_python=args.engine_python,
                         startup_timeout_s=args.engine_startup_timeout, tokenizer=args.tokenizer,
                         seed=args.seed, continuous=args.continuous, pools=pools,
                         **_episode_options(args, limits))  # type: ignore[arg-type]
    except (EngineError, SandboxError) as e:
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2
    passk = ", ".join(f"pass@{j} {100 * v:.1f}%" for j, v in r["pass_at_k"].items())
    print(f"sample 0: resolved {r['resolved_instances']}/{r['total_instances']} "
          f"({100 * r['resolve_rate']:.1f}%), "
          f"empty {r['empty_patch_instances']}, errors {r['error_instances']}; {r['samples_total']} samples: "
          f"{passk}; mean turns {r['mean_turns']:.2f}, mean tokens {r['mean_tokens']:.1f}; "
          f"predictions: {args.out}/predictions.jsonl, report: {args.out}/report.json")
    return 1 if r["sample_errors"] else 0



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
    if args.model:
        _check_engine_flags(args)
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
    from swerl.sandbox.errors import SandboxError

    try:
        with _places(args) as pools:
            if args.expert:
                from swerl.agent import load_tokenizer

                tok = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer()
                r = asyncio.run(evaluate_async(
                    tasks, args.out, engine=ExpertEngine(tok, plans), tokenizer=tok, model_name="expert",
                    pools=pools, **common))  # type: ignore[arg-type]
            else:
                r = evaluate(tasks, args.out, model=args.model, engine=args.engine,
                             engine_url=args.engine_url, engine_python=args.engine_python,
                             startup_timeout_s=args.engine_startup_timeout,
                             tokenizer=args.tokenizer, seed=args.seed, continuous=args.continuous,
                             pools=pools, **common)  # type: ignore[arg-type]
    except (EngineError, SandboxError) as e:
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


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """`swerl eval` and its modes, on the root parser's subcommands `sub`."""
    from swerl.envs.registry import game_kind_names

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
        am.add_argument("--engine-python",
                        help="interpreter that has vLLM/SGLang installed, for a launched server (default: "
                             "python; the CPU vLLM of scripts/vllm_cpu_env.sh: .venv-vllm/bin/python)")
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
        am.add_argument("--continuous", action="store_true",
                        help="hf engine: continuous batching (an episode's turn does not wait for the "
                             "batch's longest row: faster multi-turn sampling; samples then repeat only up "
                             "to float32 kernel order)")
        am.add_argument("--ray-address",
                        help="run the episodes on the sandbox hosts of a Ray cluster: auto (the one this "
                             "node joined), HEAD:6379, or local (needs the ray extra); default: this machine")
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
