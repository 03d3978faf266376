"""Reporter protocol: how passes tell people what is happening.

Passes call these methods and never print. The CLI supplies a rich reporter
on stderr; tests and the library API use `NullReporter`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol


class Reporter(Protocol):
    """What a pass (and the libraries it drives) may report. `note`, when set, takes plain
    progress lines (distillation's loss and ETA) where no live progress bar is shown."""

    warnings: list[str]
    note: Callable[[str], Any] | None

    def pass_started(self, name: str) -> None: ...

    def pass_finished(self, name: str, seconds: float, stats: Mapping[str, Any]) -> None: ...

    def pass_failed(self, name: str) -> None: ...

    def task(self, description: str, total: int | None) -> None: ...

    def advance(self, n: int = 1, detail: str | None = None) -> None: ...

    def warn(self, message: str) -> None: ...


class NullReporter:
    """Swallows progress; collects warnings so callers can still read them."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.note: Callable[[str], Any] | None = None

    def pass_started(self, name: str) -> None: ...

    def pass_finished(self, name: str, seconds: float, stats: Mapping[str, Any]) -> None: ...

    def pass_failed(self, name: str) -> None: ...

    def task(self, description: str, total: int | None) -> None:
        """Start a progress bar of `total` steps (replaces the previous one)."""

    def advance(self, n: int = 1, detail: str | None = None) -> None: ...

    def warn(self, message: str) -> None:
        self.warnings.append(message)
