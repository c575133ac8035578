"""What every `swerl` command group shares: the help formatter and parser class of every (sub)command, and
the SWE task selection (`--tasks`, `--split`, `--instance-ids`, `--filter`, `--limit`) that `eval` and
`tasks` both take, with its loader and the printing of a grading's failed tests."""

from __future__ import annotations

import argparse


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



DEFAULT_TASKS = "tasks/swe/instances.jsonl"


def _load_tasks(args: argparse.Namespace) -> list:
    from swerl.envs.swe.instances import load_instances

    return load_instances(args.tasks, split=args.split, instance_ids=args.instance_ids or None,
                          filters=args.filter or (), limit=args.limit)



def _task_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", default=DEFAULT_TASKS,
                   help="instances: a local .json/.jsonl/.parquet file, a folder with instances.jsonl, "
                        "or a hub dataset id (e.g. SWE-bench/SWE-bench_Verified)")
    p.add_argument("--split",
                   help="hub: dataset split (default test); local files: keep records of this split")
    p.add_argument("--instance-ids", nargs="*", help="keep exactly these instances")
    p.add_argument("--filter", action="append", help="shell pattern on instance_id (repeatable)")
    p.add_argument("--limit", type=int, help="keep the first N instances")



def _print_failed_tests(lines: list[str], most: int = 8) -> None:
    for line in lines[:most]:
        print(f"     {line}")
    if len(lines) > most:
        print(f"     ... and {len(lines) - most} more")
