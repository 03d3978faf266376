"""SIGINT and SIGTERM end a run the same clean way.

`handle_signals()` (installed by the CLI around a command) turns the first
SIGINT, SIGTERM or SIGHUP into a `Terminated` exception in the main thread.
`Terminated` is a KeyboardInterrupt, so every `except BaseException` /
`finally` on the way out runs as for Ctrl-C: the staging directory and
spilled Hessians are deleted, writer threads are stopped. Further signals
while that cleanup runs are noted and ignored, so a second Ctrl-C or a
`timeout`'s repeated SIGTERM cannot cut the cleanup short. The CLI exits with
128 + the signal number (130 for SIGINT, 143 for SIGTERM).

`deferred()` holds signals back for a few lines that must not be split (the
rename that publishes an artifact and the check that follows it).

Start-up (importing torch) and interpreter shutdown are covered by the console
entry point, tfcompile/cli/main.py: a signal while the modules load ends the
process with one line and 128 + N; after the command, `handle_signals(final=True)`
leaves the signals ignored, so a late one cannot raise in an atexit hook or
replace the exit status with death by signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _State:
    received: int | None = None  # the first signal
    defer_depth = 0
    pending: int | None = None  # arrived while deferred
    unwinding = False  # a failure is being unwound (`unwinding()`): signals are ignored
    done = False  # the command has returned: what is left is the process's exit


_state = _State()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by the first SIGINT / SIGTERM / SIGHUP."""

    published = None  # the output path, when the signal came during its (completed) publish

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        _state.received = _state.received or signum  # from here on, cleanup must not be cut short
        self.signum = signum
        self.name = signal.Signals(signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum, frame) -> None:
    if _state.received is not None or _state.unwinding or _state.done:
        return  # cleanup of the first signal, or of a failure, is running: let it finish
    if _state.defer_depth:
        _state.pending = _state.pending or signum
        return
    _state.received = signum
    raise Terminated(signum)


@contextlib.contextmanager
def handle_signals(final: bool = False) -> Iterator[None]:
    """Install the handlers for the duration of a command (main thread only; no-op elsewhere).
    `final`: the process exits next, so the signals are left ignored instead of restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.received, _state.pending, _state.defer_depth, _state.unwinding = None, None, 0, False
    _state.done = False
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        _state.done = True  # from here `_handler` ignores what comes while the handlers are swapped back
        for s, h in old.items():
            signal.signal(s, signal.SIG_IGN if final else h)


@contextlib.contextmanager
def installed(handler, signums) -> Iterator[None]:
    """`handler` for `signums` during the block, the previous handlers restored after it."""
    old = {s: signal.getsignal(s) for s in signums}
    for s in signums:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def unwinding() -> None:
    """A failure is being unwound (until the command ends): later signals are ignored, as during
    a signal's own cleanup. Under torchrun a failed rank makes torchrun SIGTERM the others, which
    are by then reporting it and removing the staging directory: that must not be cut short."""
    _state.unwinding = True


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then raise `Terminated` for one that came."""
    _state.defer_depth += 1
    try:
        yield
    finally:
        _state.defer_depth -= 1
    if not _state.defer_depth and _state.pending is not None and _state.received is None and not _state.unwinding:
        signum, _state.pending = _state.pending, None
        _state.received = signum
        raise Terminated(signum)
