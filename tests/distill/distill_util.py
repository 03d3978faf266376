"""Helpers shared by the distillation tests (tests/distill is on sys.path, like tests/layout)."""

from __future__ import annotations

import json

import torch


def manifest(out) -> dict:
    return json.loads((out / "tfcompile" / "manifest.json").read_text())


def dequantized(out) -> dict[str, torch.Tensor]:
    """module -> tfcompile's dequantize() of the artifact's stored tensors (float32)."""
    from tfcompile.artifact.naming import qtensor_of
    from tfcompile.io.checkpoint import open_checkpoint
    from tfcompile.kernels.formats import dequantize
    from tfcompile.schemes import get_scheme

    m = manifest(out)
    scheme = get_scheme(m["scheme"]["name"])
    with open_checkpoint(out) as ckpt:
        return {la["module"]: dequantize(qtensor_of(ckpt, scheme, la["module"], *la["shape"])).clone()
                for la in m["layers"]}
