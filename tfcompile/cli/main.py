"""`tfcompile`'s entry points: `main(argv)` (in-process, the tests' and bench's way) and
`entry()` (the console script, `python -m tfcompile`, torchrun). Exit codes: 0 ok, 1 user
error or failed check, 2 usage/internal, 128 + N after signal N.

Light on purpose: only the standard library is imported here, so `entry` can take SIGINT,
SIGTERM and SIGHUP before the command line (tfcompile/cli/app.py: click, torch, transformers)
is imported. A signal while those load, which takes a second or more, ends the process with
one line and 128 + N instead of a KeyboardInterrupt traceback from inside `import torch` (or a
death by SIGTERM). Python's own start-up, before this module runs, is not covered.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ONE_SHOT = False  # set by `entry`: this process runs one command and exits


@contextlib.contextmanager
def importing():
    """Around a command's heavy imports (torch, transformers, every pass). In a one-shot process
    (`entry`) the collector is off while they load (they build about a million long-lived objects,
    and the collections their allocations trigger find no garbage: 0.15 s of CPU of a 1.4 s import
    on the 2-core Xeon of docs/performance.md), then everything alive is moved into its permanent
    generation and it is on again: modules, functions and classes live until exit anyway; frozen,
    no later collection walks them, and interpreter shutdown does not either (its final collection
    took 0.67-0.86 s of a loaded data-free RTN run, 0.23-0.25 s frozen; issue 32). Objects made
    after this are collected as usual. In-process callers (`main`, the tests, which run many
    commands in one interpreter) are left alone: there a frozen object is never freed."""
    if not _ONE_SHOT:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _startup_handler(signum, frame) -> None:
    """End the process at once: nothing has been created yet (the command installs its own
    handlers, tfcompile/io/signals.py, before it touches a file), so there is nothing to clean
    up. Not an exception: a library's bare `except:` around an import would swallow it and
    leave a half-imported module behind (seen with numpy under ml_dtypes)."""
    for s in _SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    name = signal.Signals(signum).name
    # os.write, not sys.stderr: the main thread may be inside a buffered write
    os.write(2, f"interrupted by {name} during start-up; nothing was written\n".encode())
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run `tfcompile ARGV...` in this process and return its exit code."""
    from tfcompile.cli.app import main as run  # lazy: this module stays stdlib-only (see above)

    return run(argv)


def entry() -> None:
    """Console-script wrapper (`tfcompile`): exits with the command's code."""
    global _ONE_SHOT
    _ONE_SHOT = True
    for s in _SIGNALS:
        signal.signal(s, _startup_handler)
    from tfcompile.cli.app import main as run  # lazy: after the handlers, so they cover torch's import

    # `final`: when the command returns, the signals stay ignored through interpreter shutdown
    code = run(None, final=True)
    sys.exit(code)


if __name__ == "__main__":
    entry()
