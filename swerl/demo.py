"""`swerl sandbox demo`: an agent-style script drives a few tool calls in a real container.

It is what `scripts/setup.sh` runs at the end, to show the harness end to end on a fresh machine:
build a task image from `tasks/demo/calculator` (repo + pytest from host-downloaded wheels), start a
sandbox with no network, look around, run the failing tests, edit the file, rerun, take the diff.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax

from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.images import TaskImageRecipe, build_base_image, build_task_image, download_wheels

ROOT = Path(__file__).resolve().parents[1]


def run_demo(console: Console | None = None) -> str:
    """Run the scripted episode; returns the final diff."""
    console = console or Console()
    build_base_image(log=lambda s: console.print(f"[dim]{s}[/dim]"))
    wheels = download_wheels(["pytest==9.2.0"], ROOT / ".cache" / "wheels" / "demo")
    recipe = TaskImageRecipe(name="demo-calculator", repo_dir=ROOT / "tasks" / "demo" / "calculator",
                             wheels_dir=wheels, requirements=("pytest",))
    t = time.perf_counter()
    image = build_task_image(recipe)
    console.print(f"task image [bold]{image}[/bold] ready in {time.perf_counter() - t:.1f}s")

    with DockerSandbox(SandboxSpec(image=image, memory="1g")) as sb:
        def call(cmd: str) -> None:
            r = sb.run(cmd, timeout=60)
            style = "green" if r.exit_code == 0 else "red"
            console.print(Panel(r.output.rstrip() or "(no output)", title=f"$ {cmd}",
                                subtitle=f"exit {r.exit_code} · {r.duration_s * 1000:.0f} ms",
                                border_style=style))

        call("git log --oneline && ls -R calc tests")
        call("python3 -m pytest -q 2>&1 | tail -5")
        source = sb.read_text("/testbed/calc/__init__.py")
        console.print(Panel(Syntax(source, "python"), title="read_file /testbed/calc/__init__.py"))
        fixed = source.replace("/ (len(values) + 1)", "/ len(values)")
        sb.write_file("/testbed/calc/__init__.py", fixed)
        console.print("[bold]write_file[/bold] /testbed/calc/__init__.py (divide by len(values))")
        call("python3 -m pytest -q 2>&1 | tail -3")
        call("python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), timeout=3)\" 2>&1 | tail -1")
        patch = sb.diff()
        console.print(Panel(Syntax(patch, "diff"), title="diff() against the base commit"))
    return patch
