"""Helpers shared by the layout tests (tests/layout is on sys.path, like tests/interop)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Quick calibration for the FP8 KV-cache scales (random tokens: the scales only need to exist).
CALIB = ("--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32")


def tokens(vocab: int, n: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def descriptor(artifact: Path) -> dict:
    return json.loads((artifact / "tfcompile" / "kv_cache.json").read_text())


def hf_logits(artifact: Path, toks: torch.Tensor, kv: str = "off", dtype=torch.float32) -> torch.Tensor:
    """The untransformed model: transformers with the artifact's dequantized weights (tfcompile eval)."""
    from tfcompile.evaluate.models import load_candidate

    cand = load_candidate(artifact, dtype, kv_cache=kv)
    if dtype == torch.float64 and cand.model._can_set_experts_implementation():
        cand.model.set_experts_implementation("eager")  # torch's grouped_mm has no float64 kernel
    with torch.no_grad():
        return cand.model(toks[None]).logits[0].float()
