"""The live progress line of `swerl train` (`TrainDisplay`): step, phase, episodes in flight, the last
step's headline numbers and the ETA, drawn with rich (imported when used) when the output is a
terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


class TrainDisplay:
    """What the user of `swerl train` sees: one live line per run with the step, the phase, episodes done
    and in flight, the last step's headline numbers and the ETA (rich). Off when the output is not a
    terminal or `metrics.progress` is false; the log lines still go out either way.

        with TrainDisplay(total_steps, start_step) as ui:
            ui.phase("rollout"); ui.episodes(summary); ui.step_done(row)
    """

    def __init__(self, total_steps: int, start_step: int = 0, *, enabled: bool = True,
                 log: Callable[[str], None] | None = print, console: Console | None = None) -> None:
        from rich.console import Console

        self.total, self.start = total_steps, start_step
        self.log = log
        self.console = console or Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._fields = {"phase": "starting", "episodes": "", "last": ""}

    def __enter__(self) -> TrainDisplay:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(bar_width=20), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("[bold]{task.fields[phase]}"),
                TextColumn("{task.fields[episodes]}"), TextColumn("{task.fields[last]}"),
                console=self.console, transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self.start,
                                                 **self._fields)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def _update(self, **kw: Any) -> None:
        self._fields.update(kw)
        if self._progress is not None:
            self._progress.update(self._task, **kw)

    def phase(self, name: str) -> None:
        """rollout | learn | sync | checkpoint | export."""
        self._update(phase=name, episodes="" if name != "rollout" else self._fields["episodes"])

    def episodes(self, summary: Any) -> None:
        """A runner's counts (done / total, in flight, failed)."""
        failed = f", failed {summary.failed}" if summary.failed else ""
        self._update(episodes=f"episodes {summary.done}/{summary.total} ({summary.running} in "
                              f"flight{failed})")

    def step_done(self, step: int, line: str, short: str) -> None:
        """After a step: advance the bar, show `short`, log `line`."""
        if self._progress is not None:
            self._progress.update(self._task, completed=step, last=short, episodes="")
            self._progress.console.print(line, highlight=False)
        elif self.log:
            self.log(line)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)
        elif self.log:
            self.log(text)
