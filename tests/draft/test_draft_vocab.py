"""The reduced draft vocabulary (tfcompile/draft/run.py `set_vocabulary`): the draft scores the most
frequent training ids with the target's own lm_head rows, and d2t / t2d map them as speculators'
Eagle3 format reads them (target id = draft id + d2t[draft id]; t2d[target id] = kept)."""

from collections import Counter
from pathlib import Path

import torch

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"


def test_reduced_vocabulary_is_the_most_frequent_ids_with_the_targets_rows():
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import _config, build_draft
    from tfcompile.evaluate.models import load_checkpoint_model

    target = load_checkpoint_model(DEMO, torch.float32, "reference")
    cfg = _config(DEMO)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, int(cfg["vocab_size"]), (4, 64), generator=g)
    tokens[:, :12] = torch.tensor([7, 7, 7, 3, 3, 90, 90, 90, 90, 5, 5, 5])  # clear leaders, then ties by id
    draft = build_draft(target, cfg, DraftConfig(init="random", draft_vocab=6), tokens)

    counts = Counter(tokens.reshape(-1).tolist())
    want = sorted(sorted(counts, key=lambda t: (-counts[t], t))[:6])  # most frequent, ties: lower id
    ids = torch.arange(6) + draft.d2t
    assert ids.tolist() == want
    head = target.get_output_embeddings().weight.detach().float()
    assert torch.equal(draft.lm_head.weight, head[ids])
    assert draft.t2d.nonzero().reshape(-1).tolist() == want


def test_full_vocabulary_has_no_map():
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import _config, build_draft
    from tfcompile.evaluate.models import load_checkpoint_model

    target = load_checkpoint_model(DEMO, torch.float32, "reference")
    cfg = _config(DEMO)
    vocab = int(cfg["vocab_size"])
    draft = build_draft(target, cfg, DraftConfig(init="random", draft_vocab=vocab), torch.zeros(1, 8, dtype=torch.int64))
    assert draft.d2t is None and draft.t2d is None
    assert torch.equal(draft.lm_head.weight, target.get_output_embeddings().weight.detach().float())
