"""`swerl sandbox ...`: the Docker sandbox harness (build-base, reap, ls, prune-images, demo,
build-textgames): its handlers and its sub-parsers."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table


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

    run_demo(model=args.model, temperature=args.temperature, max_turns=args.max_turns,
             max_new_tokens=args.max_new_tokens, seed=args.seed)
    return 0


def _sandbox_build_textgames(args: argparse.Namespace) -> int:
    from swerl.envs.textgame.image import build_textgame_image

    print(build_textgame_image(log=print if args.verbose else None))
    return 0



def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """`swerl sandbox` and its subcommands, on the root parser's subcommands `sub`."""
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
    de = sb.add_parser("demo", help="a scripted agent fixes a bug through tool calls in a sandbox (or a real "
                                    "model tries to: --model)")
    de.add_argument("--model", help="an HF model directory, or a shipped model's name (`swerl models list`), "
                                    "to play the episode in process instead of the script")
    de.add_argument("--temperature", type=float, default=0.7, help="the model's sampling temperature")
    de.add_argument("--max-turns", type=int, default=10, help="the model's turn budget")
    de.add_argument("--max-new-tokens", type=int, default=384, help="tokens per model turn")
    de.add_argument("--seed", type=int, default=0, help="sampling seed")
    de.set_defaults(fn=_sandbox_demo)
    bt = sb.add_parser("build-textgames", help="build the text-game image (ALFWorld, WebShop: wheels "
                                               "installed offline, game data); cached by content hash")
    bt.add_argument("--verbose", action="store_true", help="show the build log")
    bt.set_defaults(fn=_sandbox_build_textgames)
