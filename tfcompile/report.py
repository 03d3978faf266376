"""Reporter protocol: how passes tell people what is happening.

Passes call these methods and never print. The CLI supplies a rich reporter
on stderr; tests and the library API use `NullReporter`.
"""

from __future__ import annotations

from typing import Any, Mapping


class NullReporter:
    """Swallows progress; collects warnings so callers can still read them."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def pass_started(self, name: str) -> None: ...

    def pass_finished(self, name: str, seconds: float, stats: Mapping[str, Any]) -> None: ...

    def pass_failed(self, name: str) -> None: ...

    def task(self, description: str, total: int | None) -> None:
        """Start a progress bar of `total` steps (replaces the previous one)."""

    def advance(self, n: int = 1, detail: str | None = None) -> None: ...

    def warn(self, message: str) -> None:
        self.warnings.append(message)
