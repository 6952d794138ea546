"""Stage-by-stage progress of a long command (export: torch.export, passes, save) on stderr.

Shown with rich only on a terminal: stdout stays clean for results and ``--json``, and logs or pipes
get no spinner frames. Stage times are measured either way, for the command's summary line.
"""
from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def report_console() -> Console:
    """The console a command's report goes to: stdout, wide when not a terminal (a pipe or a log keeps
    each line whole; rich would wrap at 80 columns)."""
    return Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else 200)


class Stages:
    """One stage at a time: ``begin`` ends the previous one; ``advance`` moves a stage with a total."""

    def __init__(self, enabled: bool | None = None, console: Console | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self.seconds: dict[str, float] = {}
        self._progress = Progress(
            SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
            # The stream now, not whatever sys.stderr is later: export quiets torch's prints by swapping it.
            console=console or Console(file=sys.stderr)) if enabled else None
        self._name: str | None = None
        self._task = None
        self._t0 = 0.0

    def __enter__(self) -> Stages:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.end()
        if self._progress is not None:
            self._progress.stop()

    def begin(self, name: str, total: int | None = None) -> None:
        self.end()
        self._name, self._t0 = name, time.perf_counter()
        if self._progress is not None:
            self._task = self._progress.add_task(name, total=total, detail="")

    def advance(self, detail: str = "") -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, detail=detail)

    def end(self) -> None:
        if self._name is None:
            return
        self.seconds[self._name] = time.perf_counter() - self._t0
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[self._task]
            done = task.total if task.total is not None else 1
            self._progress.update(self._task, total=done, completed=done, detail="")
        self._name, self._task = None, None
