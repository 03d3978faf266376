"""Teacher targets for a micro-batch: computed on the fly, or read from a disk cache.

- online (default): the teacher model runs on every micro-batch (no grad), so
  both models are in memory (for the demo LM: 2 x 21 MB of fp32 weights) and
  each step costs one extra forward (~1/3 of the student's forward + backward).
  Exact logits and, for distill.hidden_weight, hidden states.
- cache: before training, the teacher runs once over every training block and
  keeps the `topk` largest logits per position (values float32, indices int32)
  in two raw files, memory-mapped while training; then the teacher is freed, so
  training holds one model. Size: blocks x seq_len x k x 8 bytes (1600 blocks x
  256 x 64 = 210 MB); topk = 0 keeps all V logits (x V/k: 13 GB for that run at
  V = 4096, which is why top-k exists). The loss against a top-k teacher is the
  KL to the teacher renormalised over its top k tokens (loss.py says what that
  changes). Blocks repeat across epochs, so the cache also saves the repeated
  teacher forwards of a multi-epoch run.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tfcompile.distill.loss import TopK, topk_logits
from tfcompile.io.atomic import write_atomic


@dataclass(frozen=True)
class Targets:
    logits: torch.Tensor | TopK  # [B, L, V] or the top k
    hidden: tuple | None = None  # teacher hidden states (online teacher, hidden_weight > 0)


class OnlineTeacher:
    def __init__(self, model: torch.nn.Module, hidden: bool):
        self.model, self.hidden = model, hidden

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, blocks: torch.Tensor) -> Targets:
        out = self.model(input_ids=ids, output_hidden_states=self.hidden)
        return Targets(out.logits.float(), tuple(out.hidden_states) if self.hidden else None)


class CachedTeacher:
    """Top-k teacher logits of every training block, memory-mapped from `directory`."""

    VALUES, INDICES, META = "teacher_values.f32", "teacher_indices.i32", "teacher_cache.json"

    def __init__(self, directory: Path, shape: tuple[int, int, int]):
        self.values = torch.from_numpy(np.memmap(directory / self.VALUES, np.float32, "c", shape=shape))
        self.indices = torch.from_numpy(np.memmap(directory / self.INDICES, np.int32, "c", shape=shape))

    def __call__(self, ids: torch.Tensor, blocks: torch.Tensor) -> Targets:
        return Targets(TopK(self.values[blocks].clone(), self.indices[blocks].long()))

    @classmethod
    def open_or_build(cls, directory: Path, model: torch.nn.Module, train: torch.Tensor, k: int,
                      batch: int, progress=None) -> "CachedTeacher":
        """Reuse a complete cache for the same blocks and k, else build it (atomically)."""
        directory.mkdir(parents=True, exist_ok=True)
        n, length = train.shape
        vocab = int(model.get_output_embeddings().weight.shape[0])
        kk = vocab if k <= 0 or k >= vocab else k
        meta = {"blocks": n, "seq_len": length, "k": kk, "tokens_sha256": _digest(train)}
        shape = (n, length, kk)
        meta_path = directory / cls.META
        if meta_path.is_file() and json.loads(meta_path.read_text()) == meta:
            return cls(directory, shape)
        _build(directory, model, train, kk, batch, progress)
        # the cache counts only once its meta file exists
        write_atomic(meta_path, (json.dumps(meta, sort_keys=True) + "\n").encode(), fsync=False)
        return cls(directory, shape)


def _build(directory: Path, model, train: torch.Tensor, k: int, batch: int, progress) -> None:
    """Stream the top-k logits of every block into the two raw files, then rename them in."""
    n, length = train.shape
    tmp_v = directory / (CachedTeacher.VALUES + ".tmp")
    tmp_i = directory / (CachedTeacher.INDICES + ".tmp")
    vals = np.memmap(tmp_v, np.float32, "w+", shape=(n, length, k))
    idx = np.memmap(tmp_i, np.int32, "w+", shape=(n, length, k))
    if progress is not None:
        progress.task("teacher cache", -(-n // batch))
    with torch.no_grad():
        for start in range(0, n, batch):
            top = topk_logits(model(input_ids=train[start:start + batch]).logits, k)
            vals[start:start + batch] = top.values.numpy()
            idx[start:start + batch] = top.indices.to(torch.int32).numpy()
            if progress is not None:
                progress.advance(1, f"{min(start + batch, n)}/{n} blocks")
    vals.flush()
    idx.flush()
    del vals, idx
    os.replace(tmp_v, directory / CachedTeacher.VALUES)
    os.replace(tmp_i, directory / CachedTeacher.INDICES)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
