"""MXFP8 / MXFP4 (OCP Microscaling v1.0): blocks of 32 along K, one E8M0
(power-of-two) scale per block, E4M3 or E2M1 elements.

Shared-exponent rules (the rule is recorded in QTensor.rule):
- "floor" (OCP v1.0 §6.3): e = floor(log2(amax)) - emax_elem, emax_elem = 2
  for E2M1 (max 6 = 1.5*2^2) and 8 for E4M3 (max 448 = 1.75*2^8). The block
  maximum can exceed the element max and clip (amax 7 -> scale 1 -> 6).
- "ceil" (cuBLAS/NVIDIA RCEIL, torchao RCEIL, modelopt): the smallest e with
  amax <= max_elem * 2^e, i.e. ceil(log2(amax / max_elem)) in exact
  arithmetic; never clips.
Both are computed exactly from frexp (mantissa m in [1, 2), exponent fl):
floor gives fl - emax; ceil adds 1 when m > max_elem / 2^emax (1.5 or 1.75).
e is clamped to the E8M0 range [-127, 127]; an all-zero block gets e = 0
(scale 1.0, code 127). Elements: x / 2^e, then RNE + saturate (E2M1 or E4M3).
Defaults are the rule with lower measured error per element type (docs/formats.md).
"""

from __future__ import annotations

import torch

from . import fast
from .checks import check_divisible, check_finite, check_input
from .elements import cast_e4m3, decode_e8m0, encode_e2m1, encode_e8m0
from .impl import use_fast
from .packing import pack_fp4
from .qtensor import QTensor

BLOCK = 32
RULES = ("floor", "ceil")
# Measured (docs/formats.md, `python bench/formats.py --rules`): for MXFP4 floor
# beats ceil (18.79 vs 18.76 dB Gaussian, 16.89 vs 16.54 dB Student-t df=3);
# for MXFP8 ceil wins clearly (31.48 vs 30.67 dB, 31.54 vs 28.94 dB) because
# floor clips block maxima in (448, 512) * 2^e. So each element type has its own.
DEFAULT_MX_RULE = "floor"       # MXFP4 (and quantize_mx_act(elem="fp4"))
DEFAULT_MXFP8_RULE = "ceil"     # MXFP8 (and quantize_mx_act(elem="fp8"))

# element format -> (emax_elem, max_elem / 2^emax_elem); the ONNX MX functions build from it too
# (tfcompile/onnx_export/functions.py)
MX_ELEMENTS = {"fp4": (2, 1.5), "fp8": (8, 1.75)}


def mx_shared_exponent(amax: torch.Tensor, elem: str, rule: str) -> torch.Tensor:
    """Block max |x| (float32, finite, >= 0) -> unbiased int32 exponent in [-127, 127]."""
    if rule not in RULES:
        raise ValueError(f"MX rule must be one of {RULES}, got {rule!r}")
    emax, top = MX_ELEMENTS[elem]
    mant, exp = torch.frexp(amax.float())          # amax = mant * 2^exp, mant in [0.5, 1)
    fl = exp.to(torch.int32) - 1                   # floor(log2(amax)), exact
    e = fl - emax
    if rule == "ceil":
        e = e + (mant * 2 > top).to(torch.int32)   # amax > max_elem * 2^(fl-emax): one more
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    return e.clamp(-127, 127)


def _reference(x: torch.Tensor, elem: str, rule: str, name: str | None):
    """Plain torch spec. x float32 [..., K] -> (data, E8M0 scale [..., K/32])."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    amax = xb.abs().amax(-1)                                     # [..., K/32]
    check_finite(amax, name)
    scale = encode_e8m0(mx_shared_exponent(amax, elem, rule))
    y = (xb / decode_e8m0(scale)[..., None]).reshape(x.shape)  # exact power-of-two division
    data = pack_fp4(encode_e2m1(y)) if elem == "fp4" else cast_e4m3(y)
    return data, scale


def _quantize_mx(w: torch.Tensor, elem: str, rule: str, name: str | None, impl: str,
                 min_ndim: int) -> QTensor:
    fmt = "mxfp4" if elem == "fp4" else "mxfp8"
    check_input(w, name, min_ndim, fmt.upper())
    check_divisible(w, BLOCK, name, fmt.upper())
    if rule not in RULES:
        raise ValueError(f"MX rule must be one of {RULES}, got {rule!r}")
    if use_fast(impl, w):
        data, scale = fast.mx_blocks(w, 4 if elem == "fp4" else 8, rule == "ceil", name)
    else:
        data, scale = _reference(w.float(), elem, rule, name)
    return QTensor(fmt, data, scale, None, tuple(w.shape), "group", rule, (BLOCK,))


def quantize_mxfp8(w: torch.Tensor, *, rule: str = DEFAULT_MXFP8_RULE, name: str | None = None,
                   impl: str = "auto") -> QTensor:
    """Weight [N, K] or [E, N, K] -> MXFP8 QTensor (E4M3 data, E8M0 scale [..., K/32])."""
    return _quantize_mx(w, "fp8", rule, name, impl, 2)


def quantize_mxfp4(w: torch.Tensor, *, rule: str = DEFAULT_MX_RULE, name: str | None = None,
                   impl: str = "auto") -> QTensor:
    """Weight [N, K] or [E, N, K] -> MXFP4 QTensor (packed E2M1 [..., K/2], E8M0 [..., K/32])."""
    return _quantize_mx(w, "fp4", rule, name, impl, 2)


def quantize_mx_act(x: torch.Tensor, elem: str = "fp4", *, rule: str | None = None,
                    name: str | None = None, impl: str = "auto") -> QTensor:
    """Activation [..., K] -> dynamic MX QTensor (per 1x32 block); decode with `dequantize`.
    rule None: the element type's default (DEFAULT_MX_RULE / DEFAULT_MXFP8_RULE)."""
    if elem not in MX_ELEMENTS:
        raise ValueError(f"elem must be 'fp4' or 'fp8', got {elem!r}")
    rule = rule or (DEFAULT_MX_RULE if elem == "fp4" else DEFAULT_MXFP8_RULE)
    return _quantize_mx(x, elem, rule, name, impl, 1)
