"""Small helpers shared by test modules (importable: tests/ is on sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files directly under `path`."""
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out
