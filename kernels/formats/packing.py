"""FP4 nibble packing: two E2M1 codes per byte along the last (K) axis.

Low nibble first: byte j = code[2j] | code[2j+1] << 4, the layout of
compressed-tensors `pack_fp4_to_uint8`, modelopt NVFP4QTensor, torchao
`pack_uint4` and Triton `tl.dot_scaled` (docs/formats.md "Packing and layout").
"""

from __future__ import annotations

import torch

from tfcompile.errors import FormatError


def pack_fp4(codes: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
    """uint8 codes [..., K] (values 0..15) -> uint8 [..., K/2]."""
    k = codes.shape[-1]
    if k % 2:
        who = f"tensor {name!r}" if name else "FP4 codes"
        raise FormatError(f"{who}: last dimension {k} is odd, cannot pack two FP4 codes per byte",
                          hint="pad K to an even size or exclude the layer with --ignore")
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], k // 2, 2)
    return (c[..., 0] & 0xF) | ((c[..., 1] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K] (low nibble is the even index)."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
