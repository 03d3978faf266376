"""`impl=` argument handling shared by the quantizers."""

from __future__ import annotations

import torch

from . import fast

IMPLS = ("auto", "reference", "fast")


def use_fast(impl: str, x: torch.Tensor) -> bool:
    """auto: fused kernel when it can run here; fast: required; reference: never."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference":
        return False
    ok = fast.available(x)
    if impl == "fast" and not ok:
        raise RuntimeError("impl='fast' requested but the fused CPU kernels are unavailable "
                           "for this tensor (device, dtype, or no C compiler)")
    return ok
