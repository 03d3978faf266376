"""Scales of a published quantized checkpoint, checked against their weight before use.

A scale is input like any tensor: one of the wrong shape decodes garbage (or the wrong block
size) and an integer or NaN one decodes a model no engine would load. Each check raises a
CheckpointError naming the checkpoint, the scale and what was expected (exit 1):
- `check_header`: dtype in the allowed set, shape exactly the one the weight implies
  (from the safetensors header, before anything is read);
- `check_values`: every value finite, and positive where the scale is the weight's only one
  (a per-tensor / per-channel / global scale), not negative where it is a block's (an
  all-zero block stores 0); an E8M0 byte 255 is NaN.
"""

from __future__ import annotations

import torch

from tfcompile.errors import CheckpointError

FLOAT_CODES = {"F32", "BF16", "F16"}
_HINT = "the checkpoint's scales do not match its weights: re-download it, or dequantize it to bf16 first"


def check_header(ckpt, scale: str, weight: str, dtypes: set[str], shapes: list[tuple[int, ...]]) -> None:
    """`scale`'s header dtype is in `dtypes` and its shape one of `shapes` (implied by `weight`)."""
    info = ckpt.info(scale)
    if info.dtype not in dtypes or tuple(info.shape) not in [tuple(s) for s in shapes]:
        want = " or ".join(str(list(s)) for s in shapes)
        raise CheckpointError(f"{ckpt.path}: {scale} is {info.dtype} {list(info.shape)}; its weight {weight} "
                              f"{list(ckpt.info(weight).shape)} needs {'/'.join(sorted(dtypes))} {want}",
                              hint=_HINT)


def check_values(path, name: str, t: torch.Tensor, *, per_block: bool) -> torch.Tensor:
    """`t` (a scale read from the checkpoint) if its values are usable; else CheckpointError."""
    if t.dtype == torch.uint8:  # E8M0: 2^(b - 127); 255 encodes NaN
        bad = int((t == 255).sum())
        what = "NaN (E8M0 255)"
    else:
        v = t.float()
        nonfinite, low = ~torch.isfinite(v), (v < 0) if per_block else (v <= 0)
        bad = int((nonfinite | low).sum())
        what = "non-finite or negative" if per_block else "non-finite, zero or negative"
    if bad:
        raise CheckpointError(f"{path}: {name} has {bad} {what} value(s) of {t.numel()}", hint=_HINT)
    return t


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["FLOAT_CODES", "cdiv", "check_header", "check_values"]
