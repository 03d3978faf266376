"""Fixtures for tests/distill: a tiny Llama, a text file to distill on, a small-run recipe."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

# A few steps on 32-token blocks of the tiny model: seconds per run on 2 cores.
FAST = ["--steps", "4", "--batch", "2", "--set", "distill.seq_len=32", "--set", "distill.heldout_tokens=128",
        "--set", "distill.warmup=1", "--set", "distill.log_every=1"]


@pytest.fixture(scope="session")
def distill_text(model_factory, tmp_path_factory) -> Path:
    """200 one-line documents of the tiny tokenizer's words (its held-out 10% by hash: ~20)."""
    rng = random.Random(0)
    words = model_factory._WORDS
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(60)) for _ in range(200)) + "\n")
    return path


@pytest.fixture(scope="session")
def fast(distill_text) -> list[str]:
    """Options of a short distillation on `distill_text`."""
    return ["--data", str(distill_text), *FAST]
