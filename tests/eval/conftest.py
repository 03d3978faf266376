"""Fixtures for tests/eval: an evaluation text and tiny-Llama artifacts, built once per session."""

from __future__ import annotations

import contextlib
import io
import random

import pytest

WORDS = ("the quick brown fox jumps over a lazy dog while model weights are quantized to four "
         "or eight bits and scaled per block of sixteen values so kernels run fast").split()


@pytest.fixture(scope="session")
def eval_text(tmp_path_factory):
    """A deterministic plain-text file (about 4000 words from the tiny tokenizer's vocabulary)."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(200)]
    path = tmp_path_factory.mktemp("eval-text") / "eval.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def eval_artifact(tiny_llama_src, tmp_path_factory):
    """eval_artifact("nvfp4") -> the tiny Llama quantized in that format (cached for the session)."""
    from tfcompile.cli.main import main

    root, cache = tmp_path_factory.mktemp("eval-artifacts"), {}

    def get(fmt: str, *sets: str):
        """`sets`: extra `pass.field=value` settings (each its own artifact)."""
        key = (fmt, *sets)
        if key not in cache:
            out, err = root / "-".join(key).replace("=", "_"), io.StringIO()
            # static activation scales: a short calibration is enough here
            extra = ["--set", "calibrate.samples=4", "--set", "calibrate.seq_len=32"] if fmt in ("nvfp4", "fp8") else []
            extra += [a for s in sets for a in ("--set", s)]
            with contextlib.redirect_stderr(err):
                code = main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", fmt, "-q", *extra])
            assert code == 0, err.getvalue()[-3000:]
            cache[key] = out
        return cache[key]

    return get
