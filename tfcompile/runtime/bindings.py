"""Which tensor goes to which parameter of each kernel (tfcompile.kernels.triton).

A kernel's parameters are named in its emitted JSON (`arg_order`); constexprs
come from the JSON too. Here, per kernel, are the runtime arguments for one
Linear: `act_args` quantizes x (bf16 [M, K]) into the operand and scales the
GEMM reads, `gemm_args` computes y (bf16 [M, N]). Layouts follow the kernels'
docstrings (docs/kernels.md): TN GEMMs, weights as the artifact stores them,
Blackwell-swizzled block scales for the block-scaled GEMMs (prepared once).

`BINDERS` maps a kernel name to its binder; a kernel without one runs emulated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from tfcompile.kernels.formats import quantizer_of, to_blackwell_scale_layout

FP8_GROUP = 128


@dataclass
class Weights:
    """One Linear's tensors on the GPU, as the kernels read them."""
    n: int
    k: int
    data: torch.Tensor  # e4m3 [N, K] or packed u8 [N, K/2]
    scale: torch.Tensor  # as stored: fp32-converted for FP8, e4m3 / E8M0 u8 [N, K/VEC] for the block formats
    swizzled: torch.Tensor | None  # Blackwell layout of `scale` (block-scaled GEMMs)
    global_scale: torch.Tensor  # (1,) fp32: NVFP4 weight_global_scale, else 1
    static: torch.Tensor | None  # (1,) fp32: input_scale (fp8) / input_global_scale (nvfp4)


def prepare(ql) -> Weights:
    """Weights of a QuantLinear in kernel layouts (one-time transforms)."""
    dev = ql.data.device
    blocks = quantizer_of(ql.qtensor).block_scaled  # 8-bit scales per K block, swizzled; else FP8's float scales
    scale = ql.scale.contiguous() if blocks else ql.scale.float().contiguous()
    swz = to_blackwell_scale_layout(ql.scale.reshape(ql.out_features, -1)).contiguous() if blocks else None
    g = ql.global_scale.float().reshape(1) if ql.global_scale is not None else torch.ones(1, device=dev)
    static = ql.static_scale.float().reshape(1).contiguous() if ql.static_scale is not None else None
    return Weights(ql.out_features, ql.in_features, ql.data.contiguous(), scale, swz, g.contiguous(), static)


def _swizzled_numel(rows: int, kb: int) -> int:
    return math.ceil(rows / 128) * math.ceil(kb / 4) * 512


def _scales(m: int, kb: int, swizzle: bool, dtype, dev) -> torch.Tensor:
    if swizzle:  # the kernel writes the padding itself
        return torch.empty(_swizzled_numel(m, kb), dtype=dtype, device=dev)
    return torch.empty(m, kb, dtype=dtype, device=dev)


# ----------------------------------------------------------------------------- activation quantization
# (x, weights, config) -> (runtime args, (operand, its scales))


def _act_fp8(mode: str):
    def bind(x, w: Weights, cfg):
        m, k = x.shape
        q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
        if mode == "static":
            s = w.static
        else:
            s = torch.empty(m, 1 if mode == "token" else math.ceil(k / FP8_GROUP), dtype=torch.float32,
                            device=x.device)
        return {"x_ptr": x, "q_ptr": q, "s_ptr": s, "M": m}, (q, s)
    return bind


def _act_mx(fp4: bool):
    def bind(x, w: Weights, cfg):
        m, k = x.shape
        q = torch.empty(m, k // 2 if fp4 else k, dtype=torch.uint8 if fp4 else torch.float8_e4m3fn,
                        device=x.device)
        s = _scales(m, k // 32, cfg.get("SWIZZLE", True), torch.uint8, x.device)
        return {"x_ptr": x, "q_ptr": q, "s_ptr": s, "M": m}, (q, s)
    return bind


def _act_nvfp4(x, w: Weights, cfg):
    m, k = x.shape
    q = torch.empty(m, k // 2, dtype=torch.uint8, device=x.device)
    s = _scales(m, k // 16, cfg.get("SWIZZLE", True), torch.float8_e4m3fn, x.device)
    return {"x_ptr": x, "g_ptr": w.static, "q_ptr": q, "s_ptr": s, "M": m}, (q, s)


# ----------------------------------------------------------------------------- GEMMs
# (a, a_scale, weights, out [M, N] bf16, config) -> (runtime args, split-K workspace or None)


def _fp8_gemm(a, sa, w: Weights, out, cfg):
    return {"a_ptr": a, "b_ptr": w.data, "c_ptr": out, "a_scale_ptr": sa, "b_scale_ptr": w.scale,
            "M": a.shape[0]}, None


def _block_scaled(a, sa, w: Weights, out, cfg):
    one = torch.ones(1, dtype=torch.float32, device=a.device)
    return {"a_ptr": a, "a_scale_ptr": sa, "b_ptr": w.data, "b_scale_ptr": w.swizzled, "c_ptr": out,
            "a_gs_ptr": w.static if w.static is not None else one, "b_gs_ptr": w.global_scale,
            "M": a.shape[0]}, None


def _w4a16(a, sa, w: Weights, out, cfg):
    split = int(cfg.get("SPLIT_K", 1))
    ws = None if split == 1 else torch.empty(split, a.shape[0], w.n, dtype=torch.float32, device=a.device)
    return {"a_ptr": a, "b_ptr": w.data, "b_scale_ptr": w.scale, "b_gs_ptr": w.global_scale,
            "c_ptr": out if ws is None else ws, "M": a.shape[0]}, ws


def _splitk_reduce(ws, out, m: int) -> dict:
    return {"ws_ptr": ws, "c_ptr": out, "M": m}


ACT_BINDERS: dict[str, Callable] = {
    "act_quant_fp8_static": _act_fp8("static"), "act_quant_fp8_token": _act_fp8("token"),
    "act_quant_fp8_group": _act_fp8("group"), "act_quant_mxfp4": _act_mx(True),
    "act_quant_mxfp8": _act_mx(False), "act_quant_nvfp4": _act_nvfp4,
}
GEMM_BINDERS: dict[str, Callable] = {
    "fp8_gemm_tensor": _fp8_gemm, "fp8_gemm_channel": _fp8_gemm, "fp8_gemm_block": _fp8_gemm,
    "fp4_gemm_nvfp4": _block_scaled, "fp4_gemm_mxfp4": _block_scaled, "mxfp8_gemm": _block_scaled,
    "w4a16_gemm_nvfp4": _w4a16, "w4a16_gemm_mxfp4": _w4a16,
}
FOLLOWUP_BINDERS: dict[str, Callable] = {"splitk_reduce": _splitk_reduce}


# Synthetic GEMM A operands (what the act-quant kernel would produce), for timing GEMMs alone:
# kernel -> (m, k, device) -> (a, a_scale). Values are valid codes; their magnitudes do not matter.
def _e4m3(m, k, dev):
    return torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)


def _scale_bytes(numel, dtype, dev):
    if dtype == torch.uint8:  # E8M0 2^-2 .. 2^2
        return torch.randint(125, 130, (numel,), dtype=torch.uint8, device=dev)
    return (torch.rand(numel, device=dev) + 0.5).to(dtype)


A_OPERANDS: dict[str, Callable] = {
    "fp8_gemm_tensor": lambda m, k, d: (_e4m3(m, k, d), torch.ones(1, device=d)),
    "fp8_gemm_channel": lambda m, k, d: (_e4m3(m, k, d), torch.ones(m, 1, device=d)),
    "fp8_gemm_block": lambda m, k, d: (_e4m3(m, k, d), torch.ones(m, math.ceil(k / FP8_GROUP), device=d)),
    "fp4_gemm_nvfp4": lambda m, k, d: (torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device=d),
                                       _scale_bytes(_swizzled_numel(m, k // 16), torch.float8_e4m3fn, d)),
    "fp4_gemm_mxfp4": lambda m, k, d: (torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device=d),
                                       _scale_bytes(_swizzled_numel(m, k // 32), torch.uint8, d)),
    "mxfp8_gemm": lambda m, k, d: (_e4m3(m, k, d), _scale_bytes(_swizzled_numel(m, k // 32), torch.uint8, d)),
    "w4a16_gemm_nvfp4": lambda m, k, d: (torch.randn(m, k, device=d, dtype=torch.bfloat16), None),
    "w4a16_gemm_mxfp4": lambda m, k, d: (torch.randn(m, k, device=d, dtype=torch.bfloat16), None),
}


def synthetic_weights(scheme, n: int, k: int, dev) -> Weights:
    """Random weights of `scheme`'s format in kernel layouts (for timing)."""
    wq = scheme.weights
    static = torch.ones(1, device=dev) if scheme.act_static else None
    def data():  # valid codes: packed E2M1 pairs [N, K/2] or E4M3 [N, K]
        return torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev) if wq.packed else _e4m3(n, k, dev)

    if not wq.block_scaled:  # FP8: float scales per tensor, channel or 128x128 tile
        return Weights(n, k, data(), torch.ones(wq.scale_shape(n, k), device=dev), None,
                       torch.ones(1, device=dev), static)
    kb = k // wq.block[0]  # 8-bit scales (E4M3 / E8M0) per block along K, drawn before the codes
    scale = _scale_bytes(n * kb, wq.scale_dtype(torch.bfloat16), dev).reshape(n, kb)
    return Weights(n, k, data(), scale, to_blackwell_scale_layout(scale).contiguous(), torch.ones(1, device=dev),
                   static)


def has_binder(kernel: str) -> bool:
    return kernel in ACT_BINDERS or kernel in GEMM_BINDERS or kernel in FOLLOWUP_BINDERS
