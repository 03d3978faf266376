"""Input validation shared by the quantizers; every failure is a FormatError."""

from __future__ import annotations

import torch

from tfcompile.errors import FormatError

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def who(name: str | None) -> str:
    return f"tensor {name!r}" if name else "input tensor"


def check_input(w: torch.Tensor, name: str | None, min_ndim: int, fmt: str) -> None:
    """dtype in bf16/fp16/fp32, enough dims, on CPU-or-any device, non-empty."""
    if not isinstance(w, torch.Tensor):
        raise FormatError(f"{who(name)}: expected a torch.Tensor, got {type(w).__name__}")
    if w.dtype not in FLOAT_DTYPES:
        raise FormatError(f"{who(name)} has dtype {w.dtype}; {fmt} quantization takes "
                          "bfloat16, float16 or float32",
                          hint="convert the tensor to bfloat16/float32 first, or exclude it with --ignore")
    if w.ndim < min_ndim:
        raise FormatError(f"{who(name)} has shape {tuple(w.shape)}; {fmt} needs at least {min_ndim} dims",
                          hint="exclude this tensor with --ignore")
    if w.numel() == 0:
        raise FormatError(f"{who(name)} is empty (shape {tuple(w.shape)})", hint="exclude it with --ignore")


def check_divisible(w: torch.Tensor, block: int, name: str | None, fmt: str) -> None:
    k = w.shape[-1]
    if k % block:
        raise FormatError(
            f"{who(name)} has K={k} (last dim of shape {tuple(w.shape)}), not divisible by the "
            f"{fmt} block size {block}",
            hint=f"exclude this layer with --ignore {name or '<layer>'} (or pad K to a multiple of {block})")


def check_finite(amax: torch.Tensor, name: str | None) -> None:
    """amax propagates NaN/Inf, so checking it costs no extra pass over the data."""
    if not bool(torch.isfinite(amax).all()):
        raise_nonfinite(name)


def raise_nonfinite(name: str | None) -> None:
    raise FormatError(f"{who(name)} contains NaN or Inf values; it cannot be quantized",
                      hint="check the checkpoint for corruption or overflow, or exclude "
                           "the tensor with --ignore")
