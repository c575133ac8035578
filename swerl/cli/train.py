"""`swerl train`, `swerl sft`, `swerl plot` and `swerl compare`: the training loop, the SFT warm start,
and a run's dashboard figure and headline table (read back from metrics.jsonl by swerl.runlog): their
handlers and their sub-parsers."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


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


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """`swerl train`, `sft`, `plot` and `compare`, on the root parser's subcommands `sub`."""
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
