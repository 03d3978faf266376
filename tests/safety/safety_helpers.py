"""Helpers for the safety tests: leftovers next to OUT, file-tree digests, the outcome of a
failed run, and `Paused`, a real `tfcompile` process held at a chosen function."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def leftovers(out: Path) -> list[str]:
    """Temp dirs, lock files and aside copies a run may leave next to `out`."""
    parent = Path(out).absolute().parent
    if not parent.is_dir():
        return []
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{Path(out).name}."))


def tree_digest(path: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `path` (symlinks as their target text)."""
    out = {}
    for p in sorted(Path(path).rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(path))] = "link:" + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_clean_failure(res, out: Path, *needles: str, code: int = 1) -> None:
    """Exit `code` with `error:` + `hint:` naming `needles`, no traceback, nothing at or next to OUT."""
    assert res.code == code, (res.code, res.err)
    assert "Traceback" not in res.err, res.err
    assert "error: " in res.err and "hint: " in res.err, res.err
    for n in needles:
        assert n in res.err, (n, res.err)
    assert not Path(out).exists(), "nothing may be left at OUT"
    assert leftovers(out) == [], "no temp dir or lock may be left next to OUT"


class Paused:
    """A `tfcompile` subprocess paused inside `target` (see paused_run.py)."""

    def __init__(self, target: str, args: list, tmp: Path, seconds: float = 60, env: dict | None = None):
        self.marker = tmp / f"paused-{time.monotonic_ns()}"
        cmd = [sys.executable, str(HERE / "paused_run.py"), target, str(self.marker), str(seconds),
               *[str(a) for a in args]]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, start_new_session=True)

    def wait_paused(self, timeout: float = 180) -> None:
        end = time.monotonic() + timeout
        while not self.marker.exists():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"run ended (exit {self.proc.returncode}) before pausing:\n{err}")
            if time.monotonic() > end:
                self.kill()
                raise AssertionError("run never reached the paused function")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.communicate()


def quantize_to(src: Path, out: Path, *extra: str) -> Path:
    """Run `tfcompile quantize SRC -o OUT --format nvfp4a16 -q EXTRA...` in-process; OUT."""
    from tfcompile.cli.main import main

    assert main(["quantize", str(src), "-o", str(out), "--format", "nvfp4a16", "-q", *map(str, extra)]) == 0
    return out


def private_copy(src: Path, dst: Path) -> Path:
    """A copy a test may damage (symlinks copied as symlinks)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst
