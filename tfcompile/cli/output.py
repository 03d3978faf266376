"""Where output goes: data on stdout, people on stderr.

- stdout carries data only: with --json one JSON document, else nothing
  but what the command is for (e.g. `plan` prints the recipe).
- stderr carries progress, tables, warnings and errors, through rich.
  NO_COLOR, a non-TTY stderr, CI=true or TERM=dumb turn off colour and
  live progress: a long step then prints one plain line every
  $TFCOMPILE_PROGRESS_INTERVAL seconds (default 10; 0 = every step), e.g.
  `calibrate 4 layers x 8 batches: 12/32 (38%) 41s elapsed, eta 1m07s  layer 2/4`.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from tfcompile.dist import current
from tfcompile.settings import settings



LOG_WIDTH = 240  # columns off a TTY (a log file, a CI pipe): rich's default there is 80, which wraps tables


def stderr_console() -> Console:
    plain = bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"
    tty = sys.stderr.isatty()
    return Console(stderr=True, no_color=plain, highlight=False, force_terminal=None if tty else False,
                   width=None if tty or os.environ.get("COLUMNS") else LOG_WIDTH)


def rank_output(quiet: bool, as_json: bool) -> tuple[Console, bool, bool]:
    """(console, quiet, as_json): under torchrun only rank 0 prints progress, warnings, tables and
    --json; the other ranks print only their errors (main's `error:` lines)."""
    root = current().is_root
    return stderr_console() if root else Console(file=io.StringIO()), quiet or not root, as_json and root


def live_progress_allowed(console: Console) -> bool:
    return console.is_terminal and not os.environ.get("CI") and not os.environ.get("NO_COLOR")


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def _secs(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class PlainTask:
    """A step's progress as plain lines (off a TTY): at most one line per `interval` seconds."""
    description: str
    total: int | None
    interval: float
    done: int = 0
    start: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    lines: int = 0

    def advance(self, n: int, detail: str | None, now: float | None = None) -> str | None:
        """The line to print after `n` more steps, or None (not due yet)."""
        self.done += n
        now = time.monotonic() if now is None else now
        finished = self.total is not None and self.done >= self.total
        if now - self.last < self.interval and not (finished and self.lines):
            return None
        self.last, self.lines = now, self.lines + 1
        return self.line(detail, now)

    def line(self, detail: str | None, now: float) -> str:
        elapsed = now - self.start
        if self.total:
            pct = f" ({100 * self.done / self.total:.0f}%)"
            eta = elapsed / self.done * (self.total - self.done) if self.done else None
            head = f"{self.done}/{self.total}{pct} {_secs(elapsed)} elapsed" + (f", eta {_secs(eta)}" if eta is not None else "")
        else:
            head = f"{self.done} steps, {_secs(elapsed)} elapsed"
        return f"{self.description}: {head}" + (f"  {detail}" if detail else "")


class RichReporter:
    """Progress per pass and per unit of work on stderr: a rich bar with ETA on a TTY, one
    plain line per PROGRESS_INTERVAL seconds otherwise; nothing with `quiet`."""

    def __init__(self, console: Console, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.warnings: list[str] = []
        self.note = None  # plain progress lines (a callable), set by commands that print them off a TTY
        self._live = live_progress_allowed(console) and not quiet
        self._progress: Progress | None = None
        self._task = None
        self._plain: PlainTask | None = None

    def pass_started(self, name: str) -> None:
        if not self.quiet and not self._live:
            self.console.print(f"[bold]{name}[/] ...")

    def pass_finished(self, name: str, seconds: float, stats: Mapping[str, Any]) -> None:
        self._stop()
        if not self.quiet:
            self.console.print(f"[green]done[/] {name} in {seconds:.2f}s{_breakdown(stats)}")

    def pass_failed(self, name: str) -> None:
        self._stop()

    def task(self, description: str, total: int | None) -> None:
        """Start the progress of one step (`total` units, None if unknown); replaces the last one."""
        self._stop()
        if self.quiet or not description:
            return
        if not self._live:
            self._plain = PlainTask(description, total, settings().progress_interval)
            return
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                  TextColumn("{task.fields[detail]}"), console=self.console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(description, total=total, detail="")

    def advance(self, n: int = 1, detail: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, detail=detail or "")
        elif self._plain is not None and (line := self._plain.advance(n, detail)) is not None:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)  # one line in logs

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self.console.print(f"[yellow]warning:[/] {escape(message)}")  # paths and names are not markup

    def _stop(self) -> None:
        self._plain = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _breakdown(stats: Mapping[str, Any]) -> str:
    """What a pass's time went to when it hides a slow step (pack runs an algorithm's solves lazily), or
    what calibrate's forwards computed in."""
    solve, dtype = (stats or {}).get("solve_seconds_per_layer"), (stats or {}).get("compute_dtype")
    if dtype:  # calibrate: what its forwards computed in, and why (tfcompile/machine.py compute_dtype)
        return f" (forwards in {dtype}: {stats.get('compute_dtype_why', '')})"
    return f" (GPTQ solves {sum(solve.values()):.2f}s of it, {len(solve)} layers)" if solve else ""
