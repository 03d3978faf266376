"""A checkpoint with some tensors replaced: how a pass hands pack new weights.

A pass that changes weights (distill) writes the changed tensors, and only
those, to one safetensors file (`write_overlay`: streamed tensor by tensor
through ShardWriter, fsynced, renamed into place) and puts an
`OverlayCheckpoint` in the context's `source`. It is a `Checkpoint` whose index
points those names at the overlay file and every other name at the original
shards: pack reads it exactly as it reads any checkpoint (memory-mapped views,
pages released after each job), so its streaming and memory model do not
change. Same names, dtypes and shapes as the base (checked), so every plan and
program made from the base still holds. `files` stays the base's: the manifest
records the original checkpoint as the source, and `provenance` says what
replaced which tensors (the manifest stores it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import torch

from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.dtypes import torch_dtype_of
from tfcompile.io.safetensors_header import read_header
from tfcompile.io.writer import ShardPlan, ShardWriter, TensorSpec


def write_overlay(path: Path, specs: list[TensorSpec], tensors: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """Stream `tensors` (in `specs` order, each produced when needed) into `path`, atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    writer = ShardWriter(tmp, ShardPlan(path.name, tuple(specs)))
    try:
        for name, t in tensors:
            writer.write(name, t)
        writer.close()
    except BaseException:
        writer.abort()
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


class OverlayCheckpoint(Checkpoint):
    """`base` with the tensors of `overlay_file` in place of the same names."""

    def __init__(self, base: Checkpoint, overlay_file: Path, provenance: dict[str, Any], keep: Any = None):
        over = read_header(Path(overlay_file)).tensors
        infos = {n: base.info(n) for n in base.names()}
        for name, info in over.items():
            old = infos.get(name)
            if old is None or old.dtype != info.dtype or tuple(old.shape) != tuple(info.shape):
                raise ValueError(f"overlay tensor {name} ({info.dtype} {list(info.shape)}) does not replace "
                                 f"a base tensor of the same dtype and shape")
            infos[name] = info
        super().__init__(base.path, base.config, infos, list(base.files))
        self.base = base
        self.overlay_file = Path(overlay_file)
        self.replaced = tuple(sorted(over))
        self.provenance = provenance  # JSON-able; the manifest stores it
        self._keep = keep  # e.g. the TemporaryDirectory holding overlay_file: lives as long as we do


def overlay_specs(base: Checkpoint, names: Iterable[str]) -> list[TensorSpec]:
    """TensorSpecs of `names` as the base stores them (the overlay keeps dtype and shape)."""
    return [TensorSpec(n, torch_dtype_of(base.info(n).dtype), tuple(base.info(n).shape)) for n in names]
