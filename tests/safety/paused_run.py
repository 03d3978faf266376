"""Run `tfcompile ARGS...` with one function patched to pause, so a test can signal or race it.

    python paused_run.py MODULE:ATTR MARKER SECONDS ARGS...

The first call of MODULE.ATTR (a module function or `Class.method`) runs the
original, then writes MARKER (the pid) and sleeps SECONDS in short steps, so a
signal to the main thread interrupts it. The exit code is tfcompile's.

With PAUSED_RUN_ATEXIT=FILE in the environment, an atexit hook (run after the command
returned, during interpreter shutdown, as torch's own finalizers are) writes FILE and
sleeps a few seconds, so a test can signal the process while it exits.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path


def _patch(target: str, marker: Path, seconds: float) -> None:
    module, attr = target.split(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)
    fired: list[bool] = []

    def paused(*args, **kwargs):
        result = real(*args, **kwargs)
        if not fired:
            fired.append(True)
            marker.write_text(str(os.getpid()))
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(0.02)
        return result

    setattr(owner, name, paused)


def _slow_exit(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    end = time.monotonic() + 3
    while time.monotonic() < end:
        time.sleep(0.02)


if __name__ == "__main__":
    target, marker, seconds, *args = sys.argv[1:]
    if os.environ.get("PAUSED_RUN_ATEXIT"):
        import atexit

        atexit.register(_slow_exit, Path(os.environ["PAUSED_RUN_ATEXIT"]))
    _patch(target, Path(marker), float(seconds))
    from tfcompile.cli.main import entry

    sys.argv = ["tfcompile", *args]
    entry()
