"""Held-out figures before and after distillation, computed as `tfcompile eval` computes them.

The student (fake-quantized weights and activations, exactly the artifact's
values) and the teacher run on the same held-out rows; the running sums are
tfcompile.evaluate.metrics.LogitMetrics, so with the same tokens these equal
what `tfcompile eval OUT --reference MODEL` reports for the packed artifact
(before: the plain round-to-nearest artifact `tfcompile quantize` would write).
"""

from __future__ import annotations

import math

import torch

from tfcompile.evaluate.metrics import LogitMetrics
from tfcompile.evaluate.text import batches

KEYS = ("kl_mean", "perplexity", "reference_perplexity", "ppl_increase", "top1_agreement", "tokens")


def heldout_metrics(student: torch.nn.Module, teacher: torch.nn.Module, rows: list, batch_size: int = 4,
                    release=None, progress=None) -> dict | None:
    """{kl_mean, perplexity, reference_perplexity, ppl_increase, top1_agreement, tokens}, 6 significant digits.
    `progress` (a pipeline reporter's task/advance), if given, advances once per batch."""
    if not rows:
        return None
    m = LogitMetrics()
    was = student.training
    student.eval()
    try:
        with torch.no_grad():
            for ids in batches(rows, batch_size):
                m.update(ids, student(input_ids=ids).logits, teacher(input_ids=ids).logits)
                if release is not None:
                    release()
                if progress is not None:
                    progress.advance(1)
    finally:
        student.train(was)
    r = m.result()
    return {k: sig(r[k]) for k in KEYS}


def sig(v, digits: int = 6):
    """Round to `digits` significant digits (figures stable against summation order)."""
    if isinstance(v, bool) or not isinstance(v, float):
        return v
    if not math.isfinite(v) or v == 0:
        return v if math.isfinite(v) else None
    return float(f"{v:.{digits}g}")
