"""Safetensors dtype codes: their sizes, and the torch dtypes we read and write.

The codes are the strings a safetensors header stores in `"dtype"`. `BITS`
lists every code the safetensors 0.8 reader accepts, so a header naming
anything else is corrupt or from a future format. Sub-byte codes (F4, F6_*)
pack several elements per byte; a tensor's byte size is numel * bits / 8 and
must come out whole.
"""

from __future__ import annotations

import math

import torch

# code -> bits per element (safetensors `Dtype::bitsize`).
BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# torch dtype -> code, for the dtypes `ShardWriter` writes. Float8 tensors are
# streamed as raw bytes (viewed as uint8), so only the code differs.
TORCH_TO_CODE: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}

# code -> torch dtype, for every code torch can hold (reading is wider than writing).
CODE_TO_TORCH: dict[str, torch.dtype] = {
    **{code: dtype for dtype, code in TORCH_TO_CODE.items()},
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "C64": torch.complex64,
    **({"F8_E8M0": torch.float8_e8m0fnu} if hasattr(torch, "float8_e8m0fnu") else {}),
}

# Codes a weight may have before quantization.
FLOAT_CODES = frozenset({"BF16", "F16", "F32"})
# Codes that mean a tensor already holds quantized data (or its scales).
QUANTIZED_CODES = frozenset({"F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0", "U8", "I8"})


def byte_size(code: str, shape: tuple[int, ...]) -> int | None:
    """Bytes a tensor of `code` and `shape` occupies, or None if not whole bytes."""
    bits = math.prod(shape) * BITS[code]
    return bits // 8 if bits % 8 == 0 else None


def torch_dtype_of(code: str) -> torch.dtype:
    """Torch dtype for a safetensors code; ValueError for codes torch cannot hold (F4, F6_*)."""
    try:
        return CODE_TO_TORCH[code]
    except KeyError:
        raise ValueError(f"safetensors dtype {code!r} has no torch equivalent") from None


def code_of(dtype: torch.dtype) -> str:
    """Safetensors code for a torch dtype; ValueError when we do not write it."""
    try:
        return TORCH_TO_CODE[dtype]
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_CODE)
        raise ValueError(f"dtype {dtype} cannot be written; supported: {supported}") from None


def dominant_code(codes) -> str | None:
    """The most frequent safetensors code of `codes` (one per tensor; ties: the first in sorted
    order), None when there are none: a checkpoint's dtype, as `load` reports it."""
    counts: dict[str, int] = {}
    for c in codes:
        counts[c] = counts.get(c, 0) + 1
    return max(sorted(counts), key=lambda c: counts[c]) if counts else None
