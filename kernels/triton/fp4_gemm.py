"""Block-scaled GEMM for Blackwell: MXFP4, NVFP4 (and MXFP8) with `tl.dot_scaled`.

TN layout: A [M, K] activations from act_quant, B [N, K] the checkpoint weight,
both K-major; C [M, N] row-major bf16 (fp32 accepted).

| kernel          | A, B data                  | block scales (both operands)         | epilogue                       |
|-----------------|----------------------------|--------------------------------------|--------------------------------|
| fp4_gemm_mxfp4  | packed E2M1 u8 [*, K/2]    | E8M0 u8, 1 per 32 along K            | -                              |
| fp4_gemm_nvfp4  | packed E2M1 u8 [*, K/2]    | E4M3, 1 per 16 along K               | / (g_a * g_b), the two globals |
| mxfp8_gemm      | E4M3 [*, K]                | E8M0 u8, 1 per 32 along K            | -                              |

Scales are in the Blackwell 128x4 swizzled layout (`to_blackwell_scale_layout`
of the row-major [rows, K/VEC] scales; act_quant writes it directly): per
128-row atom the K atoms are contiguous, so each K step loads one 2-D block
and permutes it to the [rows, K/VEC] view dot_scaled takes (as Triton's
block-scaled matmul tutorial does). NVFP4 globals are compressed-tensors
multipliers (`input_global_scale`, `weight_global_scale`, (1,) fp32):
x = e2m1 * s / g, so C = acc / (g_a * g_b).

On sm_100a dot_scaled lowers to `tcgen05.mma.cta_group::1.kind::mxf4nvf4
.block_scale.block16` (NVFP4), `kind::mxf4.block_scale.block32` (MXFP4) and
`kind::mxf8f6f4.block_scale.block32` (MXFP8) -- checked by test_triton_ptx.py.
DOT_SCALED=False runs the same loads and epilogue but dequantizes both tiles
to bf16 in registers (exact, see common.fp4_dequant) and uses tl.dot: the CPU
tests need it because Triton 3.9's interpreter decodes E4M3 block scales as
E8M0 in dot_scaled (docs/kernels.md); on a GPU it is an emulation path only.

Constraints: BLOCK_M, BLOCK_N multiples of 128 (one scale atom of rows),
BLOCK_K a multiple of 4*VEC; TMA rows must be 16-byte aligned (FP4: K % 32 == 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (cdiv, compile_options, e8m0_to_f32, fp4_dequant, load_swizzled_scales, pick,
                     signature_for, swizzled_numel, tile_ids)
from .registry import KernelDef, register_kernel


@triton.jit
def _dequant_tile(x, s, ROWS: tl.constexpr, BK: tl.constexpr, VEC: tl.constexpr, FP4: tl.constexpr):
    """A [ROWS, BK(/2)] data tile and its [ROWS, BK/VEC] scales -> bf16 [ROWS, BK] (exact)."""
    if FP4:
        return fp4_dequant(x, s, ROWS, BK, VEC, VEC == 32)
    w = x.to(tl.float32).reshape(ROWS, BK // VEC, VEC) * e8m0_to_f32(s)[:, :, None]
    return w.reshape(ROWS, BK).to(tl.bfloat16)


@triton.jit
def block_scaled_gemm_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, a_gs_ptr, b_gs_ptr, M,
                             N: tl.constexpr, K: tl.constexpr, FP4: tl.constexpr, VEC: tl.constexpr,
                             DOT_SCALED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] = dequant(A) @ dequant(B)^T for MXFP4 (FP4, VEC 32), NVFP4 (FP4,
    VEC 16, globals in the epilogue) and MXFP8 (not FP4, VEC 32); layouts in the
    module docstring. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),). Target: sm_100a."""
    PACK: tl.constexpr = 2 if FP4 else 1          # elements per byte along K
    FMT: tl.constexpr = "e2m1" if FP4 else "e4m3"
    SK: tl.constexpr = BLOCK_K // VEC // 4        # scale atoms (4 K-blocks each) per K step
    KT: tl.constexpr = (K // VEC + 3) // 4        # scale atoms along K in the whole matrix
    tl.static_assert(BLOCK_M % 128 == 0 and BLOCK_N % 128 == 0, "tiles span whole scale atoms")
    tl.static_assert(BLOCK_K % (4 * VEC) == 0, "BLOCK_K must cover whole scale atoms")
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K // PACK], strides=[K // PACK, 1],
                                       block_shape=[BLOCK_M, BLOCK_K // PACK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K // PACK], strides=[K // PACK, 1],
                                       block_shape=[BLOCK_N, BLOCK_K // PACK])
    m_atoms = tl.cdiv(M, 128)
    N_ATOMS: tl.constexpr = (N + 127) // 128
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([pid_m * BLOCK_M, kt * (BLOCK_K // PACK)])
        b = b_desc.load([pid_n * BLOCK_N, kt * (BLOCK_K // PACK)])
        sa = load_swizzled_scales(a_scale_ptr, pid_m, kt * SK, m_atoms, KT, BLOCK_M, SK)
        sb = load_swizzled_scales(b_scale_ptr, pid_n, kt * SK, N_ATOMS, KT, BLOCK_N, SK)
        if DOT_SCALED:
            acc = tl.dot_scaled(a, sa, FMT, b.T, sb, FMT, acc)
        else:
            acc = tl.dot(_dequant_tile(a, sa, BLOCK_M, BLOCK_K, VEC, FP4),
                         _dequant_tile(b, sb, BLOCK_N, BLOCK_K, VEC, FP4).T, acc)
    if VEC == 16:  # NVFP4: x = e2m1 * s / g for each operand
        acc = acc / (tl.load(a_gs_ptr) * tl.load(b_gs_ptr))
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


# Imported here, below the @triton.jit functions, not at the top: Triton's cache key holds each
# kernel's starting line, and the launch metadata the artifact stores records that hash, so a
# line added above them changes artifact bytes (bench/artifact_hashes.py).
from tfcompile.kernels.formats.quantizer import weight_quantizer  # noqa: E402

_FMT = {  # kernel name -> (format, FP4 elements?, VEC = elements per block scale)
    "fp4_gemm_mxfp4": ("mxfp4", True, 32),
    "fp4_gemm_nvfp4": ("nvfp4", True, 16),
    "mxfp8_gemm": ("mxfp8", False, 32),
}


def _e4m3_scales(fmt: str) -> bool:
    """Whether weight format `fmt` stores E4M3 block scales (NVFP4; MX's are E8M0)."""
    return weight_quantizer(fmt).scale_dtype(torch.bfloat16) == torch.float8_e4m3fn


def launch_block_scaled_gemm(a, a_scale, b, b_scale, a_global=None, b_global=None, *, name: str,
                             config: dict | None = None, out: torch.Tensor | None = None,
                             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """a [M, K(/2)], b [N, K(/2)], swizzled flat scales for each; NVFP4 also takes
    the two (1,) fp32 global multipliers. Returns C [M, N].

    On CPU (interpreter) NVFP4 defaults to DOT_SCALED=False, because the
    interpreter's dot_scaled misreads E4M3 scales; pass it explicitly to override. The format
    says whether its block scales are E4M3 (tests/test_format_literals.py: no name compared)."""
    fmt, fp4, vec = _FMT[name]
    kd = _DEFS[name]
    cfg = {**kd.default_config, **(config or {})}
    if a.device.type == "cpu" and _e4m3_scales(fmt) and "DOT_SCALED" not in (config or {}):
        cfg["DOT_SCALED"] = False
    m, n = a.shape[0], b.shape[0]
    k = a.shape[1] * (2 if fp4 else 1)
    if b.shape[1] * (2 if fp4 else 1) != k or k % vec:
        raise ValueError(f"{name}: A {tuple(a.shape)} and B {tuple(b.shape)} disagree on K or K % {vec}")
    for s, rows in ((a_scale, m), (b_scale, n)):
        if s.numel() != swizzled_numel(rows, k // vec):
            raise ValueError(f"{name}: scales must be in the swizzled layout ({swizzled_numel(rows, k // vec)} "
                             f"elements for {rows} rows), got {s.numel()}")
    if a.device.type == "cuda" and (k // (2 if fp4 else 1)) % 16:
        raise ValueError(f"{name}: TMA needs 16-byte rows; K={k} gives {k // (2 if fp4 else 1)} bytes")
    one = torch.ones(1, dtype=torch.float32, device=a.device)
    ga = (a_global if a_global is not None else one).reshape(1).float()
    gb = (b_global if b_global is not None else one).reshape(1).float()
    c = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=a.device)
    fn = pick(block_scaled_gemm_kernel, a, b, c)
    fn[kd.grid(m, n, k, cfg)](a, a_scale, b, b_scale, c, ga, gb, m, n, k, fp4, vec, cfg["DOT_SCALED"],
                              cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["GROUP_M"],
                              **compile_options(cfg))
    return c


# ----------------------------------------------------------------------------- registry

_DEFS: dict[str, KernelDef] = {}


def _constexprs(fp4, vec):
    return lambda n, k, c: {"N": n, "K": k, "FP4": fp4, "VEC": vec, "DOT_SCALED": c["DOT_SCALED"],
                            "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"],
                            "GROUP_M": c["GROUP_M"]}


def _signature(fp4, vec):
    data = "*u8" if fp4 else "*fp8e4nv"
    scale = "*fp8e4nv" if vec == 16 else "*u8"

    def sig(n, k, c):
        types = {"a_ptr": data, "a_scale_ptr": scale, "b_ptr": data, "b_scale_ptr": scale,
                 "c_ptr": "*" + c.get("OUT_DTYPE", "bf16"), "a_gs_ptr": "*fp32", "b_gs_ptr": "*fp32", "M": "i32"}
        return signature_for(block_scaled_gemm_kernel, types, _constexprs(fp4, vec)(n, k, c))
    return sig


def _grid(m, n, k, c):
    return (cdiv(m, c["BLOCK_M"]) * cdiv(n, c["BLOCK_N"]),)


def _smem(fp4, vec):
    def smem(c):
        per_k = c["BLOCK_K"] // (2 if fp4 else 1)
        scales = (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] // vec
        return c["num_stages"] * ((c["BLOCK_M"] + c["BLOCK_N"]) * per_k + scales) + 2 * c["BLOCK_M"] * c["BLOCK_N"]
    return smem


def _bytes(fp4, vec):
    per = 0.5 if fp4 else 1.0
    return lambda m, n, k: (m + n) * k * per + (m + n) * k / vec + 2.0 * m * n


for _name, (_fmt, _fp4, _vec) in _FMT.items():
    _DEFS[_name] = register_kernel(KernelDef(
        name=_name, fn=block_scaled_gemm_kernel, kind="gemm", formats=(_fmt,), targets=("sm_100a",),
        signature=_signature(_fp4, _vec), constexprs=_constexprs(_fp4, _vec), grid=_grid,
        smem_bytes=_smem(_fp4, _vec), flops=lambda m, n, k: 2.0 * m * n * k, bytes_moved=_bytes(_fp4, _vec),
        knobs=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
        default_config={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 256 if _fp4 else 128, "GROUP_M": 8,
                        "DOT_SCALED": True, "num_warps": 4, "num_stages": 4},
        launch=lambda *args, _name=_name, **kw: launch_block_scaled_gemm(*args, name=_name, **kw)))
