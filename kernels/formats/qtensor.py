"""QTensor: one quantized tensor plus everything needed to decode it, and
`dequantize`, the reference decoder for every format.

Shapes (N = rows, K = last dim, leading dims like MoE experts [E] kept):
- fp8:   data float8_e4m3fn [..., N, K]; scale float32 lead+(1,) per tensor,
         [..., N, 1] per channel, [..., ceil(N/bn), ceil(K/bk)] per block.
- mxfp8: data float8_e4m3fn [..., K];   scale uint8 E8M0 [..., K/32].
- mxfp4: data uint8 packed  [..., K/2]; scale uint8 E8M0 [..., K/32].
- nvfp4: data uint8 packed  [..., K/2]; scale float8_e4m3fn [..., K/16];
         global_scale float32 multiplier (compressed-tensors: 448*6/amax),
         (1,) or one per leading index (lead+(1,)).
Decoded value: fp8 data*scale; mx data*2^(scale-127); nvfp4 e2m1*(scale/global).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .elements import decode_e2m1, decode_e8m0
from .packing import unpack_fp4

FORMATS = ("fp8", "mxfp8", "mxfp4", "nvfp4")


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no boolean ==
class QTensor:
    format: str
    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None
    shape: tuple[int, ...]
    granularity: str
    rule: str | None
    block: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}; expected one of {FORMATS}")


def expand_block_scale(scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int]) -> torch.Tensor:
    """[..., ceil(N/bn), ceil(K/bk)] -> [..., N, K] (ceil grid cropped)."""
    bn, bk = block
    s = scale.repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)
    return s[..., : shape[-2], : shape[-1]]


def broadcast_global(g: torch.Tensor, ndim_scale: int) -> torch.Tensor:
    """Global scale (1,) or lead+(1,) -> broadcastable against a [..., N, K/16] scale."""
    if g.numel() == 1:
        return g.reshape(())
    return g.reshape(*g.shape[:-1], *([1] * (ndim_scale - g.ndim + 1)))


def _dequantize_fp8(q: QTensor) -> torch.Tensor:
    x = q.data.float()
    if q.granularity == "block":
        return x * expand_block_scale(q.scale, q.shape, q.block)
    if q.granularity == "tensor":
        return x * q.scale.reshape(*q.scale.shape[:-1], *([1] * (x.ndim - q.scale.ndim + 1)))
    return x * q.scale  # channel: [..., N, 1]


def _grouped(vals: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """vals [..., K] * scale [..., K/group] broadcast along each group."""
    k = vals.shape[-1]
    return (vals.reshape(*vals.shape[:-1], k // group, group) * scale[..., None]).reshape(vals.shape)


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a QTensor to `dtype` (computed in fp32, rounded once at the end)."""
    if q.format == "fp8":
        out = _dequantize_fp8(q)
    elif q.format in ("mxfp8", "mxfp4"):
        vals = q.data.float() if q.format == "mxfp8" else decode_e2m1(unpack_fp4(q.data))
        out = _grouped(vals, decode_e8m0(q.scale), 32)
    else:  # nvfp4: compressed-tensors order, scale / global first, then multiply
        vals = decode_e2m1(unpack_fp4(q.data))
        eff = q.scale.float() / broadcast_global(q.global_scale, q.scale.ndim)
        out = _grouped(vals, eff, 16)
    return out.reshape(q.shape).to(dtype)


def dequantize_rows(q: QTensor, idx: torch.Tensor) -> torch.Tensor:
    """Decode only rows `idx` of a 2-D [N, K] QTensor, float32 [len(idx), K] (e.g. for a
    sampled SQNR), without decoding the rest."""
    data = q.data[idx]
    if q.format == "fp8":
        s = q.scale.float()
        if q.granularity == "tensor":
            return data.float() * s.reshape(())
        if q.granularity == "channel":
            return data.float() * s[idx]
        bn, bk = q.block
        per_row = s[idx // bn].repeat_interleave(bk, dim=1)[:, : data.shape[-1]]
        return data.float() * per_row
    sub = QTensor(q.format, data, q.scale[idx], q.global_scale, (len(idx), q.shape[-1]), q.granularity,
                  q.rule, q.block)
    return dequantize(sub, torch.float32)
