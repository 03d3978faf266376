"""NVFP4: E2M1 elements in blocks of 16 along K, an E4M3 scale per block and
one FP32 global scale per tensor (docs/formats.md "Block formats").

Convention kept in QTensor.global_scale: compressed-tensors' *multiplier*
g = 448*6/amax (`weight_global_scale`). modelopt stores the divisor
`weight_scale_2` = amax/2688 = 1/g; convert only with the two explicit
functions below, never by guessing from the magnitude.

Reference algorithm (compressed-tensors `calculate_qparams` + `_quantize`):
    g      = 2688 / amax_tensor              (float32; 1.0 if amax is 0)
    s_b    = e4m3(amax_block / 6 * g)        (saturating RNE; 0 -> 1.0)
    code   = e2m1(x / (s_b / g))             (RNE, saturating at ±6)
    x_hat  = e2m1_value * (s_b / g)
"""

from __future__ import annotations

import torch

from . import fast
from .checks import check_divisible, check_finite, check_input
from .elements import E2M1_MAX, E4M3_MAX, cast_e4m3, encode_e2m1
from .impl import use_fast
from .packing import pack_fp4
from .qtensor import QTensor, broadcast_global

BLOCK = 16
_ONE_E4M3 = 1.0  # stored as 0x38


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax (any shape) -> multiplier 448*6/amax, float32, same shape ((1,) for a scalar).

    Same as compressed-tensors `generate_gparam`: amax is clamped to the
    smallest normal float32 and a non-finite result (amax 0 or tiny) becomes
    1.0, so an all-zero tensor gets g = 1.0, never 0/inf/NaN.
    """
    a = amax.float().reshape(amax.shape if amax.ndim else (1,))
    g = (E4M3_MAX * E2M1_MAX) / a.clamp(min=torch.finfo(torch.float32).tiny)
    return torch.where(torch.isfinite(g), g, torch.ones_like(g))


def global_scale_to_modelopt(g: torch.Tensor) -> torch.Tensor:
    """compressed-tensors multiplier g -> modelopt `weight_scale_2` divisor (= 1/g)."""
    return 1.0 / g.float()


def global_scale_from_modelopt(ws2: torch.Tensor) -> torch.Tensor:
    """modelopt `weight_scale_2` (amax/2688) -> compressed-tensors multiplier (= 1/ws2)."""
    return 1.0 / ws2.float()


def _per_lead_global(x: torch.Tensor, amax_rows: torch.Tensor) -> torch.Tensor:
    """Row maxima [..., N] -> global multiplier: (1,) for 2-D, lead+(1,) for [E, N, K]."""
    if x.ndim <= 2:
        return nvfp4_global_scale(amax_rows.amax())
    return nvfp4_global_scale(amax_rows.reshape(*x.shape[:-2], -1).amax(-1, keepdim=True))


def _check_global(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    g = torch.as_tensor(g, dtype=torch.float32).reshape(-1, 1) if g.ndim == 0 else g.float()
    lead = tuple(x.shape[:-2])
    if g.numel() != 1 and tuple(g.shape) != lead + (1,):
        raise ValueError(f"global_scale shape {tuple(g.shape)} must be (1,) or {lead + (1,)}")
    if not bool(torch.isfinite(g).all() and (g > 0).all()):
        raise ValueError("global_scale must be finite and > 0 (the compressed-tensors multiplier)")
    return g.reshape(1) if g.numel() == 1 else g


def _reference(x: torch.Tensor, g: torch.Tensor, name: str | None):
    """Plain torch spec. x float32 [..., K] -> (packed [..., K/2], e4m3 [..., K/16])."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    amax_b = xb.abs().amax(-1)                                  # [..., K/16]
    check_finite(amax_b, name)
    gb = broadcast_global(g, amax_b.ndim)
    s = cast_e4m3(amax_b / E2M1_MAX * gb)
    s = torch.where(s.float() == 0, torch.tensor(_ONE_E4M3).to(s.dtype), s)  # zero block -> 1.0
    eff = s.float() / gb                                        # dequant multiplier per block
    codes = encode_e2m1(xb / eff[..., None]).reshape(x.shape)
    return pack_fp4(codes), s


def quantize_nvfp4(w: torch.Tensor, *, global_scale: torch.Tensor | None = None,
                   name: str | None = None, impl: str = "auto") -> QTensor:
    """Weight [N, K] or [E, N, K] (bf16/fp16/fp32) -> NVFP4 QTensor.

    global_scale: compressed-tensors multiplier, (1,) or lead+(1,). Pass the
    same one for fused q/k/v or gate/up; None computes it from this tensor
    (one per expert for [E, N, K]).
    """
    check_input(w, name, 2, "NVFP4")
    check_divisible(w, BLOCK, name, "NVFP4")
    fastpath = use_fast(impl, w)
    if global_scale is None:
        rows = fast.amax_grid(w, w.shape[-1], name)[:, 0] if fastpath else w.float().abs().amax(-1)
        check_finite(rows, name)
        g = _per_lead_global(w, rows.reshape(w.shape[:-1]))
    else:
        g = _check_global(global_scale, w)
    return _quantize_with_global(w, g, name, fastpath)


def _quantize_with_global(w: torch.Tensor, g: torch.Tensor, name: str | None, fastpath: bool) -> QTensor:
    if not fastpath:
        packed, s = _reference(w.float(), g, name)
    elif g.numel() == 1:
        packed, s = fast.nvfp4_blocks(w, float(g.reshape(())), name)
    else:  # one global per leading index (experts): one kernel call each
        lead = w.reshape(-1, *w.shape[-2:])
        parts = [fast.nvfp4_blocks(lead[i], float(gi), name) for i, gi in enumerate(g.reshape(-1))]
        packed = torch.stack([p for p, _ in parts]).reshape(*w.shape[:-1], -1)
        s = torch.stack([q for _, q in parts]).reshape(*w.shape[:-1], -1)
    return QTensor("nvfp4", packed, s, g, tuple(w.shape), "group", None, (BLOCK,))


def quantize_nvfp4_act(x: torch.Tensor, global_scale: torch.Tensor, *, name: str | None = None,
                       impl: str = "auto") -> QTensor:
    """Activation [..., K] with a calibrated (static) global multiplier (1,) ->
    NVFP4 QTensor with dynamic per-16 block scales; decode with `dequantize`."""
    check_input(x, name, 1, "NVFP4")
    check_divisible(x, BLOCK, name, "NVFP4")
    g = torch.as_tensor(global_scale, dtype=torch.float32).reshape(-1)
    if g.numel() != 1:
        raise ValueError("activation global_scale must have one element")
    return _quantize_with_global(x, g, name, use_fast(impl, x))
