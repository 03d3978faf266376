"""Helpers for tests/tune (importable by name: tests/tune is on sys.path)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

CALIB = ("--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16")


def quantize(src: Path, out: Path, fmt: str, *extra: str) -> None:
    """`tfcompile quantize` in-process; asserts success (stderr in the message)."""
    from tfcompile.cli.main import main

    calib = CALIB if fmt in ("nvfp4", "fp8") else ()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(["quantize", str(src), "-o", str(out), "--format", fmt, "-q", *calib, *extra])
    assert code == 0, err.getvalue()
