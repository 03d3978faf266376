"""Activation quantization kernels: bf16 [M, K] row-major -> the operand and
scales the W8A8 / W4A4 GEMMs read. Bit-exact with `tfcompile.kernels.formats`
(codes and scales; tests/kernels/triton/test_triton_act_quant.py).

| kernel                | output data                 | scales (layout the GEMM reads)                          |
|-----------------------|-----------------------------|---------------------------------------------------------|
| fp8 static            | e4m3 [M, K]                 | given fp32 (1,) (calibrated `input_scale`), read only    |
| fp8 per token         | e4m3 [M, K]                 | fp32 [M, 1] = amax/448 (0 -> 1.0)                        |
| fp8 per 1x128 group   | e4m3 [M, K]                 | fp32 [M, ceil(K/128)] row-major                          |
| mxfp8 / mxfp4         | e4m3 [M, K] / u8 [M, K/2]   | E8M0 u8: Blackwell 128x4 swizzle (default) or [M, K/32]  |
| nvfp4                 | u8 [M, K/2]                 | e4m3: Blackwell 128x4 swizzle (default) or [M, K/16]     |

Swizzled scales are the flat `to_blackwell_scale_layout` buffer, padding
(rows to 128, K-blocks to 4) written as zeros by the kernel itself, so the
output buffer needs no memset. NaN/Inf inputs are not checked (the reference
raises FormatError; a kernel cannot): they propagate into codes and scales.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfcompile.kernels.formats import DEFAULT_MX_RULE, DEFAULT_MXFP8_RULE

from .common import (bf16_to_f32, cdiv, compile_options, e2m1_code, e4m3_code, e8m0_to_f32, pack_fp4,
                     pick, signature_for, swizzled_numel, swizzled_offset)
from .registry import KernelDef, register_kernel

FP8_GROUP = 128


# ----------------------------------------------------------------------------- FP8


@triton.jit
def _fp8_store(x, s, q_ptr, rows, cols, mask, K: tl.constexpr):
    """q[rows, cols] = e4m3(x / s) (s broadcast), RNE + saturation."""
    q = e4m3_code(tl.math.div_rn(x, s)).to(tl.float8e4nv, bitcast=True)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], q, mask=mask)


@triton.jit
def fp8_act_quant_kernel(x_ptr, q_ptr, s_ptr, M, K: tl.constexpr, GROUP: tl.constexpr,
                         STATIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """bf16 x [M, K] -> e4m3 q [M, K], fp32 scales s (x ~ q * s).

    STATIC: s (1,) is an input. GROUP == 0: per token, s [M, 1], two passes
    over the row (amax, then quantize). GROUP == 128: s [M, ceil(K/128)], one
    tile per group (BLOCK_K == GROUP). Grid: (cdiv(M, BLOCK_M),) for per token,
    (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K)) otherwise. Targets: sm_90a, sm_100a.
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    xrow = x_ptr + rows.to(tl.int64)[:, None] * K
    if STATIC or GROUP > 0:
        tl.static_assert(STATIC or BLOCK_K == GROUP, "per-group FP8 needs BLOCK_K == GROUP")
        cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = rmask[:, None] & (cols < K)[None, :]
        x = bf16_to_f32(tl.load(xrow + cols[None, :], mask=mask, other=0.0))
        if STATIC:
            s = tl.load(s_ptr)
        else:
            amax = tl.max(tl.abs(x), axis=1)
            s = tl.math.div_rn(amax, 448.0)
            s = tl.where(s == 0.0, 1.0, s)  # zero (or underflowing) group -> 1.0
            ng: tl.constexpr = (K + GROUP - 1) // GROUP
            tl.store(s_ptr + rows.to(tl.int64) * ng + tl.program_id(1), s, mask=rmask)
            s = s[:, None]
        _fp8_store(x, s, q_ptr, rows, cols, mask, K)
    else:
        amax = tl.zeros((BLOCK_M,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = rmask[:, None] & (cols < K)[None, :]
            x = bf16_to_f32(tl.load(xrow + cols[None, :], mask=mask, other=0.0))
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        s = tl.math.div_rn(amax, 448.0)
        s = tl.where(s == 0.0, 1.0, s)
        tl.store(s_ptr + rows, s, mask=rmask)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = rmask[:, None] & (cols < K)[None, :]
            x = bf16_to_f32(tl.load(xrow + cols[None, :], mask=mask, other=0.0))
            _fp8_store(x, s[:, None], q_ptr, rows, cols, mask, K)


# ----------------------------------------------------------------------------- MX / NVFP4 shared


@triton.jit
def _load_blocks(x_ptr, M, K: tl.constexpr, VEC: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """This program's [BLOCK_M, BLOCK_K] tile as fp32 blocks [BLOCK_M, BLOCK_K/VEC, VEC]
    plus its row/col indices; rows >= M and cols >= K read as 0."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=mask, other=0.0)
    return bf16_to_f32(x).reshape(BLOCK_M, BLOCK_K // VEC, VEC), rows, cols


@triton.jit
def _store_data(y, q_ptr, rows, cols, M, K: tl.constexpr, FP4: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Elements y (already divided by their block scale) -> E2M1 packed [M, K/2] or E4M3 [M, K]."""
    y = y.reshape(BLOCK_M, BLOCK_K)
    rmask = (rows < M)[:, None]
    if FP4:
        packed = pack_fp4(e2m1_code(y), BLOCK_M, BLOCK_K)
        pcols = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * (K // 2) + pcols[None, :], packed,
                 mask=rmask & (pcols < K // 2)[None, :])
    else:
        q = e4m3_code(y).to(tl.float8e4nv, bitcast=True)
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], q, mask=rmask & (cols < K)[None, :])


@triton.jit
def _store_scales(codes, s_ptr, rows, M, K: tl.constexpr, VEC: tl.constexpr, SWIZZLE: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """Scale codes [BLOCK_M, BLOCK_K/VEC] -> row-major [M, K/VEC] or the Blackwell
    128x4 layout; padding rows/K-blocks of the swizzled buffer get 0."""
    KB: tl.constexpr = K // VEC
    kb = tl.program_id(1) * (BLOCK_K // VEC) + tl.arange(0, BLOCK_K // VEC)
    real = (rows < M)[:, None] & (kb < KB)[None, :]
    codes = tl.where(real, codes, tl.zeros_like(codes))
    if SWIZZLE:
        KT: tl.constexpr = (KB + 3) // 4
        offs = swizzled_offset(rows[:, None], kb[None, :], KT)
        mask = (rows < tl.cdiv(M, 128) * 128)[:, None] & (kb < KT * 4)[None, :]
    else:
        offs = rows.to(tl.int64)[:, None] * KB + kb[None, :]
        mask = real
    tl.store(s_ptr + offs, codes, mask=mask)


@triton.jit
def mx_act_quant_kernel(x_ptr, q_ptr, s_ptr, M, K: tl.constexpr, FP4: tl.constexpr,
                        CEIL: tl.constexpr, SWIZZLE: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """bf16 x [M, K] -> MXFP4 (packed u8 [M, K/2]) or MXFP8 (e4m3 [M, K]) with
    E8M0 u8 scales per 1x32 block; x ~ elem * 2^(s - 127).

    Shared exponent from amax's bits (exact): floor rule e = floor(log2 amax) -
    emax (2 for E2M1, 8 for E4M3); CEIL adds 1 when amax's significand exceeds
    max_elem/2^emax (1.5 / 1.75); amax 0 -> e = 0; clamp to [-127, 127].
    Grid: (cdiv(R, BLOCK_M), cdiv(K, BLOCK_K)), R = M, or M rounded up to 128
    with SWIZZLE (BLOCK_K % 128 == 0 then). Target: sm_100a (any target compiles).
    """
    if SWIZZLE:
        tl.static_assert(BLOCK_K % (4 * 32) == 0, "swizzled scales need BLOCK_K % 128 == 0")
    x, rows, cols = _load_blocks(x_ptr, M, K, 32, BLOCK_M, BLOCK_K)
    amax = tl.max(tl.abs(x), axis=2)                       # [BLOCK_M, BLOCK_K/32]
    bits = amax.to(tl.int32, bitcast=True)
    EMAX: tl.constexpr = 2 if FP4 else 8
    TOP: tl.constexpr = 0x400000 if FP4 else 0x600000      # significand 1.5 / 1.75 as mantissa bits
    e = (bits >> 23) - 127 - EMAX
    if CEIL:
        e += ((bits & 0x7FFFFF) > TOP).to(tl.int32)
    e = tl.where(amax == 0.0, 0, e)
    code = (tl.minimum(tl.maximum(e, -127), 127) + 127).to(tl.uint8)
    y = tl.math.div_rn(x, e8m0_to_f32(code)[:, :, None])   # exact power-of-two division
    _store_data(y, q_ptr, rows, cols, M, K, FP4, BLOCK_M, BLOCK_K)
    _store_scales(code, s_ptr, rows, M, K, 32, SWIZZLE, BLOCK_K)


@triton.jit
def nvfp4_act_quant_kernel(x_ptr, g_ptr, q_ptr, s_ptr, M, K: tl.constexpr, SWIZZLE: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """bf16 x [M, K] + fp32 global multiplier g (1,) (compressed-tensors
    `input_global_scale` = 2688/amax) -> packed E2M1 u8 [M, K/2] and e4m3 block
    scales per 1x16 block; x ~ e2m1 * (s / g). Same steps as quantize_nvfp4:
    s = e4m3(amax/6 * g) (0 -> 1.0), code = e2m1(x / (s / g)).
    Grid as mx_act_quant_kernel (BLOCK_K % 64 == 0 with SWIZZLE). Target: sm_100a.
    """
    if SWIZZLE:
        tl.static_assert(BLOCK_K % (4 * 16) == 0, "swizzled scales need BLOCK_K % 64 == 0")
    g = tl.load(g_ptr)
    x, rows, cols = _load_blocks(x_ptr, M, K, 16, BLOCK_M, BLOCK_K)
    amax = tl.max(tl.abs(x), axis=2)                       # [BLOCK_M, BLOCK_K/16]
    code = e4m3_code(tl.math.div_rn(amax, 6.0) * g)
    code = tl.where(code == 0, 0x38, code).to(tl.uint8)    # zero block scale -> 1.0
    s = code.to(tl.float8e4nv, bitcast=True)
    eff = tl.math.div_rn(s.to(tl.float32), g)              # dequant multiplier per block
    y = tl.math.div_rn(x, eff[:, :, None])
    _store_data(y, q_ptr, rows, cols, M, K, True, BLOCK_M, BLOCK_K)
    _store_scales(s, s_ptr, rows, M, K, 16, SWIZZLE, BLOCK_K)


# ----------------------------------------------------------------------------- launchers


def _check_x(x: torch.Tensor, block: int) -> tuple[int, int]:
    if x.dtype != torch.bfloat16 or x.ndim != 2 or not x.is_contiguous():
        raise ValueError(f"expected contiguous bf16 [M, K], got {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    if k % block:
        raise ValueError(f"K={k} is not a multiple of the block size {block}")
    return m, k


def launch_fp8_act(x: torch.Tensor, scale: torch.Tensor | None = None, *, mode: str = "token",
                   config: dict | None = None, out: tuple | None = None):
    """x bf16 [M, K] -> (e4m3 [M, K], fp32 scale). mode: static (scale given, (1,)),
    token ([M, 1]) or group ([M, ceil(K/128)]). `out`: preallocated (q, s)."""
    name = {"static": "act_quant_fp8_static", "token": "act_quant_fp8_token",
            "group": "act_quant_fp8_group"}[mode]
    cfg = {**KERNELS_DEFAULTS[name], **(config or {})}
    m, k = _check_x(x, 1)
    if mode == "static":
        if scale is None:
            raise ValueError("static FP8 activation quantization needs the calibrated scale")
        q = out[0] if out else torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
        s = scale.reshape(1).to(device=x.device, dtype=torch.float32)
    else:
        q, s = out or (torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device),
                       torch.empty(m, 1 if mode == "token" else cdiv(k, FP8_GROUP), dtype=torch.float32,
                                   device=x.device))
    fn = pick(fp8_act_quant_kernel, x)
    fn[_grid_fp8(cfg["GROUP"], cfg["STATIC"])(m, 0, k, cfg)](
        x, q, s, m, k, cfg["GROUP"], cfg["STATIC"], cfg["BLOCK_M"], cfg["BLOCK_K"],
        **compile_options(cfg))
    return q, s


def launch_mx_act(x: torch.Tensor, *, elem: str = "fp4", config: dict | None = None,
                  out: tuple | None = None):
    """x bf16 [M, K] -> (data, E8M0 scales): swizzled flat (default) or [M, K/32].
    `out`: preallocated (data, scales)."""
    name = "act_quant_mxfp4" if elem == "fp4" else "act_quant_mxfp8"
    cfg = {**KERNELS_DEFAULTS[name], **(config or {})}
    m, k = _check_x(x, 32)
    fp4 = elem == "fp4"
    q, s = out or (torch.empty(m, k // 2 if fp4 else k, dtype=torch.uint8 if fp4 else torch.float8_e4m3fn,
                               device=x.device),
                   _scale_buffer(m, k // 32, cfg["SWIZZLE"], torch.uint8, x.device))
    fn = pick(mx_act_quant_kernel, x)
    fn[_grid_blocks(m, 0, k, cfg)](x, q, s, m, k, fp4, cfg["CEIL"], cfg["SWIZZLE"], cfg["BLOCK_M"],
                                   cfg["BLOCK_K"], **compile_options(cfg))
    return q, s


def launch_nvfp4_act(x: torch.Tensor, global_scale: torch.Tensor, *, config: dict | None = None,
                     out: tuple | None = None):
    """x bf16 [M, K], g fp32 (1,) -> (packed u8 [M, K/2], e4m3 scales swizzled or [M, K/16]).
    `out`: preallocated (data, scales)."""
    cfg = {**KERNELS_DEFAULTS["act_quant_nvfp4"], **(config or {})}
    m, k = _check_x(x, 16)
    q, s = out or (torch.empty(m, k // 2, dtype=torch.uint8, device=x.device),
                   _scale_buffer(m, k // 16, cfg["SWIZZLE"], torch.float8_e4m3fn, x.device))
    g = global_scale.reshape(1).to(device=x.device, dtype=torch.float32)
    fn = pick(nvfp4_act_quant_kernel, x)
    fn[_grid_blocks(m, 0, k, cfg)](x, g, q, s, m, k, cfg["SWIZZLE"], cfg["BLOCK_M"], cfg["BLOCK_K"],
                                   **compile_options(cfg))
    return q, s


def _scale_buffer(m, kb, swizzle, dtype, device):
    if swizzle:
        return torch.empty(swizzled_numel(m, kb), dtype=dtype, device=device)
    return torch.empty(m, kb, dtype=dtype, device=device)


# ----------------------------------------------------------------------------- registry


def _grid_fp8(group, static):
    def grid(m, n, k, c):
        if group == 0 and not static:
            return (cdiv(m, c["BLOCK_M"]),)
        return (cdiv(m, c["BLOCK_M"]), cdiv(k, c["BLOCK_K"]))
    return grid


def _grid_blocks(m, n, k, c):
    rows = cdiv(m, 128) * 128 if c["SWIZZLE"] else m
    return (cdiv(rows, c["BLOCK_M"]), cdiv(k, c["BLOCK_K"]))


def _bytes_fp8(group):
    return lambda m, n, k: 2.0 * m * k + m * k + 4.0 * m * (cdiv(k, group) if group else 1)


def _bytes_blocks(fp4, vec):
    return lambda m, n, k: 2.0 * m * k + (m * k / 2 if fp4 else m * k) + m * k / vec


KERNELS_DEFAULTS: dict[str, dict] = {}
_ACT_KNOBS = ("BLOCK_M", "BLOCK_K", "num_warps")


def _register(name, fn, formats, targets, sig, consts, grid, nbytes, defaults):
    KERNELS_DEFAULTS[name] = defaults
    register_kernel(KernelDef(
        name=name, fn=fn, kind="act_quant", formats=formats, targets=targets,
        signature=lambda n, k, c: signature_for(fn, sig(c), consts(n, k, c)),
        constexprs=consts, grid=grid, smem_bytes=lambda c: 0,
        flops=lambda m, n, k: float(m * k), bytes_moved=nbytes,
        knobs=_ACT_KNOBS, default_config=defaults, launch=_LAUNCH[name]))


_FP8_SIG = lambda c: {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "M": "i32"}  # noqa: E731
_LAUNCH = {
    "act_quant_fp8_static": functools.partial(launch_fp8_act, mode="static"),
    "act_quant_fp8_token": functools.partial(launch_fp8_act, mode="token"),
    "act_quant_fp8_group": functools.partial(launch_fp8_act, mode="group"),
    "act_quant_mxfp4": functools.partial(launch_mx_act, elem="fp4"),
    "act_quant_mxfp8": functools.partial(launch_mx_act, elem="fp8"),
    "act_quant_nvfp4": launch_nvfp4_act,
}
for _name, _fmt, _group, _static, _bk, _bm in (("act_quant_fp8_static", "fp8", 0, True, 128, 32),
                                               ("act_quant_fp8_token", "fp8-dynamic", 0, False, 1024, 4),
                                               ("act_quant_fp8_group", "fp8-block", FP8_GROUP, False, 128, 32)):
    _register(_name, fp8_act_quant_kernel, (_fmt,), ("sm_90a", "sm_100a"), _FP8_SIG,
              lambda n, k, c: {"K": k, "GROUP": c["GROUP"], "STATIC": c["STATIC"],
                               "BLOCK_M": c["BLOCK_M"], "BLOCK_K": c["BLOCK_K"]},
              _grid_fp8(_group, _static), _bytes_fp8(_group or 0),
              {"GROUP": _group, "STATIC": _static, "BLOCK_M": _bm, "BLOCK_K": _bk, "num_warps": 4,
               "num_stages": 1})

for _name, _fmt, _fp4 in (("act_quant_mxfp4", "mxfp4", True), ("act_quant_mxfp8", "mxfp8", False)):
    _register(_name, mx_act_quant_kernel, (_fmt,), ("sm_100a",),
              lambda c, _fp4=_fp4: {"x_ptr": "*bf16", "q_ptr": "*u8" if _fp4 else "*fp8e4nv",
                                    "s_ptr": "*u8", "M": "i32"},
              lambda n, k, c, _fp4=_fp4: {"K": k, "FP4": _fp4, "CEIL": c["CEIL"], "SWIZZLE": c["SWIZZLE"],
                                          "BLOCK_M": c["BLOCK_M"], "BLOCK_K": c["BLOCK_K"]},
              _grid_blocks, _bytes_blocks(_fp4, 32),
              # the reference's default rule per element type (floor for FP4, ceil for FP8 today)
              {"CEIL": (DEFAULT_MX_RULE if _fp4 else DEFAULT_MXFP8_RULE) == "ceil", "SWIZZLE": True, "BLOCK_M": 32, "BLOCK_K": 128, "num_warps": 4,
               "num_stages": 1})

_register("act_quant_nvfp4", nvfp4_act_quant_kernel, ("nvfp4",), ("sm_100a",),
          lambda c: {"x_ptr": "*bf16", "g_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*fp8e4nv", "M": "i32"},
          lambda n, k, c: {"K": k, "SWIZZLE": c["SWIZZLE"], "BLOCK_M": c["BLOCK_M"], "BLOCK_K": c["BLOCK_K"]},
          _grid_blocks, _bytes_blocks(True, 16),
          {"SWIZZLE": True, "BLOCK_M": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1})
