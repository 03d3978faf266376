"""Fixtures for tests/runtime: tiny-Llama artifacts, built once per session."""

from __future__ import annotations

import contextlib
import io

import pytest

CALIB = ("--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16")


@pytest.fixture(scope="session")
def runtime_artifact(tiny_llama_src, tmp_path_factory):
    """runtime_artifact("fp8", *extra) -> the tiny Llama quantized in that format (cached per arguments)."""
    from tfcompile.cli.main import main

    root, cache = tmp_path_factory.mktemp("runtime-artifacts"), {}

    def get(fmt: str, *extra: str):
        key = (fmt, *extra)
        if key not in cache:
            out = root / f"{fmt}-{len(cache)}"
            calib = CALIB if fmt in ("nvfp4", "fp8") else ()
            with contextlib.redirect_stderr(io.StringIO()) as err:
                code = main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", fmt, "-q", *calib, *extra])
            assert code == 0, err.getvalue()
            cache[key] = out
        return cache[key]

    return get
