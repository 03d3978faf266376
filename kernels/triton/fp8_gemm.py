"""FP8 GEMM: C = (A * sa) @ (B * sb)^T, E4M3 x E4M3 -> bf16, fp32 accumulation.

TN layout, as our weights are stored: A [M, K] e4m3 row-major (activations,
from act_quant), B [N, K] e4m3 row-major (the checkpoint's `weight`), C [M, N]
row-major (bf16; fp32 also accepted). Operand tiles come through device-side
tensor descriptors (TMA on sm_90a / sm_100a; zero-filled out of bounds, so
ragged M, N, K need no masks) and meet in a plain `tl.dot`, which Triton 3.9
lowers to `wgmma.mma_async ... e4m3.e4m3` on sm_90a and `tcgen05.mma ...
kind::f8f6f4` on sm_100a. Scale modes (registered as three kernels):

| kernel            | A scale (fp32)                 | B scale (fp32 or the model dtype)    | applied         |
|-------------------|--------------------------------|--------------------------------------|-----------------|
| fp8_gemm_tensor   | (1,) static `input_scale`      | (1,) per tensor                      | epilogue        |
| fp8_gemm_channel  | [M, 1] per token               | [N, 1] per output channel            | epilogue        |
| fp8_gemm_block    | [M, ceil(K/128)] per 1x128     | [ceil(N/128), ceil(K/128)] per block | every K step    |

Block mode needs BLOCK_K == 128: each 128-wide K step's partial product is
scaled by sa[m, kb] * sb[n // 128, kb] and added to the fp32 accumulator (the
DeepSeek-V3 / vLLM w8a8 block recipe; it also promotes Hopper's limited-
precision FP8 accumulation to fp32 every 128 K).

TMA needs 16-byte aligned rows: K % 16 == 0 (and 16-byte aligned bases). The
descriptors live in a global scratch buffer of `metadata.global_scratch_size`
bytes per program, which the launcher allocates (triton.set_allocator).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import cdiv, compile_options, pick, signature_for, tile_ids
from .registry import KernelDef, register_kernel

TENSOR, ROW, BLOCK = 0, 1, 2  # scale modes: per tensor, per row (token / channel), per 128 block


@triton.jit
def fp8_gemm_kernel(a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, M,
                    N: tl.constexpr, K: tl.constexpr, SCALE_MODE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr):
    """C[M, N] = (A[M, K] * sa) @ (B[N, K] * sb)^T; see the module docstring for
    the scale layouts of SCALE_MODE 0/1/2. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),).
    Targets: sm_90a (wgmma), sm_100a (tcgen05)."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SCALE_MODE == 2:
        tl.static_assert(BLOCK_K == 128, "block-scaled FP8 needs BLOCK_K == 128")
        KB: tl.constexpr = (K + 127) // 128
        a_srow = a_scale_ptr + rm.to(tl.int64) * KB      # [BLOCK_M] rows of sa [M, KB]
        b_srow = b_scale_ptr + (rn // 128) * KB           # [BLOCK_N] rows of sb [ceil(N/128), KB]
        for kb in range(0, KB):
            a = a_desc.load([pid_m * BLOCK_M, kb * 128])
            b = b_desc.load([pid_n * BLOCK_N, kb * 128])
            sa = tl.load(a_srow + kb, mask=rm < M, other=0.0)
            sb = tl.load(b_srow + kb, mask=rn < N, other=0.0).to(tl.float32)
            acc += tl.dot(a, b.T) * (sa[:, None] * sb[None, :])
    else:
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([pid_m * BLOCK_M, k0])
            b = b_desc.load([pid_n * BLOCK_N, k0])
            acc = tl.dot(a, b.T, acc)
        if SCALE_MODE == 0:
            acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr).to(tl.float32))
        else:
            sa = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
            sb = tl.load(b_scale_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            acc = acc * sa[:, None] * sb[None, :]
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


def launch_fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
                    mode: str = "channel", config: dict | None = None, out: torch.Tensor | None = None,
                    out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """a e4m3 [M, K], b e4m3 [N, K] (contiguous), scales as in the module table
    -> C [M, N] (`out`, or a new `out_dtype` tensor)."""
    name = f"fp8_gemm_{mode}"
    kd = KERNELS_BY_MODE[mode]
    cfg = {**kd.default_config, **(config or {})}
    (m, k), n = a.shape, b.shape[0]
    if b.shape[1] != k or a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name}: expected e4m3 A [M, K], B [N, K]; got {a.dtype} {tuple(a.shape)}, "
                         f"{b.dtype} {tuple(b.shape)}")
    c = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=a.device)
    fn = pick(fp8_gemm_kernel, a, b, c)
    fn[kd.grid(m, n, k, cfg)](a.contiguous(), b.contiguous(), c, a_scale.contiguous(), b_scale.contiguous(),
                              m, n, k, _MODES[mode], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"],
                              cfg["GROUP_M"], **compile_options(cfg))
    return c


# ----------------------------------------------------------------------------- registry

_MODES = {"tensor": TENSOR, "channel": ROW, "block": BLOCK}
_FORMATS = {"tensor": ("fp8",), "channel": ("fp8-dynamic",), "block": ("fp8-block",)}
KERNELS_BY_MODE: dict[str, KernelDef] = {}


def _signature(mode):
    def sig(n, k, c):
        types = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*" + c.get("OUT_DTYPE", "bf16"),
                 "a_scale_ptr": "*fp32", "b_scale_ptr": "*" + c.get("B_SCALE_DTYPE", "fp32"), "M": "i32"}
        return signature_for(fp8_gemm_kernel, types, _constexprs(mode)(n, k, c))
    return sig


def _constexprs(mode):
    return lambda n, k, c: {"N": n, "K": k, "SCALE_MODE": _MODES[mode], "BLOCK_M": c["BLOCK_M"],
                            "BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"], "GROUP_M": c["GROUP_M"]}


def _grid(m, n, k, c):
    return (cdiv(m, c["BLOCK_M"]) * cdiv(n, c["BLOCK_N"]),)


def _smem(c):
    """Pipelined A and B tiles (1 byte/elem) plus the bf16 epilogue tile."""
    return c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] + 2 * c["BLOCK_M"] * c["BLOCK_N"]


def _bytes(mode):
    def nbytes(m, n, k):
        scales = {"tensor": 8, "channel": 4 * (m + n), "block": 4 * (m * cdiv(k, 128) + cdiv(n, 128) * cdiv(k, 128))}
        return float(m * k + n * k + 2 * m * n + scales[mode])
    return nbytes


_KNOBS = {mode: ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages") for mode in _MODES}
_KNOBS["block"] = tuple(kn for kn in _KNOBS["block"] if kn != "BLOCK_K")  # pinned to the 128-wide scale group

for _mode in ("tensor", "channel", "block"):
    KERNELS_BY_MODE[_mode] = register_kernel(KernelDef(
        name=f"fp8_gemm_{_mode}", fn=fp8_gemm_kernel, kind="gemm", formats=_FORMATS[_mode],
        targets=("sm_90a", "sm_100a"), signature=_signature(_mode), constexprs=_constexprs(_mode),
        grid=_grid, smem_bytes=_smem, flops=lambda m, n, k: 2.0 * m * n * k, bytes_moved=_bytes(_mode),
        knobs=_KNOBS[_mode],
        default_config={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8,
                        "num_warps": 4, "num_stages": 4},
        launch=lambda *args, _mode=_mode, **kw: launch_fp8_gemm(*args, mode=_mode, **kw)))
