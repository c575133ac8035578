"""The `swerl` command: `main` (the `swerl` entry point, also `python -m swerl` and `python -m
swerl.cli`), the root parser (`build_parser`, assembling each command group's sub-parsers) and the one
line an expected error prints (`error_line`).

The command groups, each its handlers and its sub-parsers: `sandbox` (swerl.cli.sandbox), `eval`
(swerl.cli.eval), `tasks` (swerl.cli.tasks), `train` / `sft` / `plot` / `compare` (swerl.cli.train),
`models` (swerl.cli.models);
the parser classes and the shared task selection: swerl.cli.common.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from swerl.cli import eval as _eval_cmds
from swerl.cli import models as _models_cmds
from swerl.cli import sandbox as _sandbox_cmds
from swerl.cli import tasks as _tasks_cmds
from swerl.cli import train as _train_cmds
from swerl.cli.common import _Parser
from swerl.cli.eval import _eval_argv


class _RootParser(_Parser):
    """The `swerl` parser: reads the eval command lines of before the subcommands (`_eval_argv`)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            argv = _eval_argv(argv)
        except ValueError as e:
            self.exit(2, f"swerl: error: {e}\n")
        return super().parse_known_args(argv, namespace)


def build_parser() -> argparse.ArgumentParser:
    p = _RootParser(prog="swerl", description="RL for LLM software-engineering agents.")
    p.add_argument("--debug", action="store_true", help="on an error, show the traceback too")
    # The `deepspeed` launcher passes --local_rank=N before the subcommand (unless --no_local_rank); the
    # rank is also in $LOCAL_RANK, which is what swerl.learner.dist reads.
    p.add_argument("--local_rank", "--local-rank", type=int, dest="local_rank", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command")

    _sandbox_cmds.add_parsers(sub)
    _eval_cmds.add_parsers(sub)
    _tasks_cmds.add_parsers(sub)
    _train_cmds.add_parsers(sub)
    _models_cmds.add_parsers(sub)
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
