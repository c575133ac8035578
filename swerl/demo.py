"""`swerl sandbox demo`: a scripted agent fixes a bug through tool calls in a real container.

What `scripts/setup.sh` runs at the end, to show the pieces end to end on a fresh machine: build a
task image from `tasks/demo/calculator` (repo + pytest from host-downloaded wheels, built with no
network), start a sandbox, and run one real agent episode — the real Qwen chat template and
tokenizer, the SWE tools, the episode loop — where the "model" is a fixed script (ScriptedEngine)
that looks at the code, runs the failing test, edits the bug away, reruns and submits. Prints each
turn and the token-exact trajectory's accounting (what the learner will train on). `--model` puts a real
model in the script's place (`swerl sandbox demo --model smollm2-135m-instruct`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from swerl.agent import ScriptedEngine, ToolEnv, load_tokenizer, run_episode
from swerl.agent import tool_call_text as call
from swerl.agent.format import tools_in_template
from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.images import TaskImageRecipe, build_task_image, download_wheels
from swerl.structs import EpisodeLimits, SamplingParams, Span, Trajectory

ROOT = Path(__file__).resolve().parents[1]
TASK = "The test suite fails: `mean([1, 2, 3])` returns 1.5 instead of 2. Fix the library in /testbed."


def think(text: str) -> str:
    # Qwen3's own layout of a reasoning block; the template renders history turns this way, so a
    # script written like this shows zero drift (any other layout is reported as drift).
    return f"<think>\n{text}\n</think>\n\n"


SCRIPT = [
    think("Let me look at the library first.")
    + call("str_replace_editor", {"command": "view", "path": "/testbed/calc/__init__.py"}),
    think("mean divides by len + 1. Let me confirm with the tests.")
    + call("bash", {"command": "cd /testbed && python3 -m pytest -q 2>&1 | tail -3"}),
    think("Confirmed; divide by the number of values.")
    + call("str_replace_editor", {"command": "str_replace", "path": "/testbed/calc/__init__.py",
                                  "old_str": "/ (len(values) + 1)", "new_str": "/ len(values)"}),
    call("bash", {"command": "cd /testbed && python3 -m pytest -q 2>&1 | tail -1"}),
    think("All tests pass.") + call("submit", {}),
]


def demo_image(console: Console) -> str:
    wheels = download_wheels(["pytest==9.2.0"], ROOT / ".cache" / "wheels" / "demo")
    recipe = TaskImageRecipe(name="demo-calculator", repo_dir=ROOT / "tasks" / "demo" / "calculator",
                             wheels_dir=wheels, requirements=("pytest",))
    t = time.perf_counter()
    image = build_task_image(recipe)
    console.print(f"task image [bold]{image}[/bold] ready in {time.perf_counter() - t:.1f}s")
    return image


def show(console: Console, traj: Trajectory) -> None:
    for turn in traj.turns:
        console.print(Panel(Text(turn.text), title=f"model turn {turn.index}", border_style="cyan"))
        if turn.observation:
            console.print(Panel(Text(turn.observation.rstrip()[-1500:]), title="observation",
                                border_style="dim"))
    gen = sum(traj.loss_mask)
    action = sum(1 for m, s in zip(traj.loss_mask, traj.span, strict=True) if m and s == Span.ACTION)
    reasoning = sum(1 for m, s in zip(traj.loss_mask, traj.span, strict=True) if m and s == Span.REASONING)
    table = Table(title="trajectory (token-exact)")
    table.add_column("what")
    table.add_column("value", justify="right")
    for k, v in [("tokens", len(traj.token_ids)), ("model tokens (loss_mask=1)", gen),
                 ("  action tokens", action), ("  reasoning tokens", reasoning),
                 ("turns / tool calls / malformed",
                  f"{traj.num_turns} / {traj.num_tool_calls} / {traj.num_malformed}"),
                 ("ended", f"{'terminated' if traj.terminated else 'truncated'} ({traj.stop_reason})"),
                 ("drift vs fresh template rendering", traj.drift_tokens),
                 ("wall time", f"{traj.wall_time_s:.2f}s")]:
        table.add_row(k, str(v))
    console.print(table)


def run_demo(console: Console | None = None, *, model: str | None = None, temperature: float = 0.7,
             max_turns: int = 10, max_new_tokens: int = 384, seed: int = 0) -> Trajectory:
    """Run the scripted episode; returns its trajectory (the submitted patch is `result`). With `model` (an
    HF directory, or a shipped model's name such as `smollm2-135m-instruct`), that model plays the
    episode instead, in process (its own tokenizer and chat template; `temperature`, `max_turns`,
    `max_new_tokens`, `seed`): whatever it does is shown, fixed or not."""
    console = console or Console()
    from swerl.sandbox.images import build_base_image

    build_base_image(log=lambda s: console.print(f"[dim]{s}[/dim]"))
    image = demo_image(console)
    if model is None:
        tokenizer = load_tokenizer()
        engine: Any = ScriptedEngine(tokenizer, SCRIPT)
        params, limits = SamplingParams(), EpisodeLimits()
    else:
        from swerl.models.shipped import resolve_model
        from swerl.rollout.config import HFEngineConfig
        from swerl.rollout.hf import HFEngine

        path = resolve_model(model, log=lambda s: console.print(f"[dim]{s}[/dim]"))
        tokenizer = load_tokenizer(path)
        engine = HFEngine(path, seed=seed, prefix_cache_mb=HFEngineConfig.prefix_cache_mb)
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
        limits = EpisodeLimits(max_turns=max_turns)
        where = ("the template's tools block" if tools_in_template(tokenizer)
                 else "swerl's system-message block")
        console.print(f"model [bold]{path}[/bold] plays the episode (tools described by {where})")
    with DockerSandbox(SandboxSpec(image=image, memory="1g")) as sb:
        env = ToolEnv(sb, TASK)
        traj = asyncio.run(run_episode(env, engine, tokenizer, params=params, limits=limits))
        show(console, traj)
        egress = sb.run("python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), "
                        "timeout=3)\" 2>&1 | tail -1")
        console.print(f"network inside the sandbox: [bold]{egress.output.strip()}[/bold]")
    console.print(Panel(Syntax(traj.result or "", "diff"), title="submitted patch"))
    fixed = traj.terminated and "/ len(values)" in (traj.result or "")
    if model is not None:
        console.print(f"the model {'fixed the bug and submitted' if fixed else 'did not submit the fix'} "
                      f"({traj.stop_reason}; {traj.num_tool_calls} tool calls, {traj.num_malformed} "
                      f"malformed turns; drift {traj.drift_tokens} tokens)")
        if traj.drift_detected:
            raise RuntimeError(f"the episode's tokens differ from a fresh rendering "
                               f"({traj.drift_tokens} tokens)")
        return traj
    if not fixed or traj.drift_detected:
        raise RuntimeError("the demo episode did not end with the fix submitted, token-exact")
    return traj
