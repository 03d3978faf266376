"""Fixtures for tests/draft: the demo LM as target, held-out prompts, a tiny trained draft."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
# A tiny draft of the demo LM: seconds of training on 2 cores (docs/accuracy.md has the real runs).
TINY = dict(steps=40, batch=4, seq_len=64, text_blocks=32, self_blocks=32, self_prompt=16, lr=1e-2, warmup=5,
            log_every=10)


@pytest.fixture(scope="session")
def demo_target():
    from tfcompile.evaluate.models import load_checkpoint_model

    return load_checkpoint_model(DEMO, torch.float32, "reference")


@pytest.fixture(scope="session")
def demo_prompts():
    """Eight 32-token prompts of python-doc's held-out split (never the training text)."""
    from tfcompile.draft.acceptance import prompts_of
    from tfcompile.evaluate.text import load_tokenizer

    return prompts_of(None, load_tokenizer(DEMO), count=8, prompt_len=32, vocab=4096)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    """A draft trained on the demo LM by `tfcompile draft` (library entry point)."""
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import run_draft

    out = tmp_path_factory.mktemp("draft") / "demo-eagle3"
    run_draft(DEMO, out, DraftConfig(**TINY))
    return out
