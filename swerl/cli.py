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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from swerl.sandbox.errors import SandboxError

    try:
        return args.fn(args)
    except SandboxError as e:
        print(f"swerl: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
