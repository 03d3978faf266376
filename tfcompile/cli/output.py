"""Where output goes: data on stdout, people on stderr.

- stdout carries data only: with --json one JSON document, else nothing
  but what the command is for (e.g. `plan` prints the recipe).
- stderr carries progress, tables, warnings and errors, through rich.
  NO_COLOR, a non-TTY stderr, CI=true or TERM=dumb turn off colour and
  live progress (plain lines instead).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)


def stderr_console() -> Console:
    plain = bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"
    return Console(stderr=True, no_color=plain, highlight=False,
                   force_terminal=None if sys.stderr.isatty() else False)


def live_progress_allowed(console: Console) -> bool:
    return console.is_terminal and not os.environ.get("CI") and not os.environ.get("NO_COLOR")


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


class RichReporter:
    """Progress per pass and per layer on stderr; plain lines when not a TTY."""

    def __init__(self, console: Console, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.warnings: list[str] = []
        self.note = None  # plain progress lines (a callable), set by commands that print them off a TTY
        self._live = live_progress_allowed(console) and not quiet
        self._progress: Progress | None = None
        self._task = None

    def pass_started(self, name: str) -> None:
        if not self.quiet and not self._live:
            self.console.print(f"[bold]{name}[/] ...")

    def pass_finished(self, name: str, seconds: float, stats: Mapping[str, Any]) -> None:
        self._stop()
        if not self.quiet:
            self.console.print(f"[green]done[/] {name} in {seconds:.2f}s")

    def pass_failed(self, name: str) -> None:
        self._stop()

    def task(self, description: str, total: int | None) -> None:
        self._stop()
        if not self._live:
            return
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[detail]}"),
                                  console=self.console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(description, total=total, detail="")

    def advance(self, n: int = 1, detail: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, detail=detail or "")

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self.console.print(f"[yellow]warning:[/] {message}")

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
