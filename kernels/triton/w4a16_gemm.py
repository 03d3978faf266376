"""Weight-only W4A16 GEMM (Hopper's path for NVFP4 / MXFP4 checkpoints; runs on
Blackwell too): FP4 weights are dequantized to bf16 in registers and meet bf16
activations in a bf16 MMA with fp32 accumulation.

TN layout: A [M, K] bf16 row-major (activations), B the checkpoint's
`weight_packed` u8 [N, K/2] (two E2M1 codes per byte along K, low nibble
first) with its row-major block scales `weight_scale` [N, K/VEC] (NVFP4: e4m3,
VEC 16; MXFP4: E8M0 u8, VEC 32) -- no Blackwell swizzle here -- and for NVFP4
the fp32 multiplier `weight_global_scale` (1,): w = e2m1 * s / g, so the
epilogue divides by g. C [M, N] row-major bf16 (fp32 accepted).

Small M (decode, M <= 16): SWAP_AB computes C^T = W @ A^T so the weight tile's
BLOCK_N rows fill the MMA's M side (wgmma m64) and the few tokens its N side
(n = BLOCK_M = 16), instead of padding 1..16 tokens to 64 rows. SPLIT_K > 1
splits the K loop over grid axis 1 for more CTAs when M*N is small: each split
writes fp32 partials to a workspace [SPLIT_K, M, N] and `splitk_reduce` sums
them in a fixed order (deterministic, no atomics) into C.

Both operands come through device-side tensor descriptors (TMA); rows must be
16-byte aligned: K % 32 == 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import cdiv, compile_options, fp4_dequant, pick, signature_for, tile_ids
from .registry import KernelDef, register_kernel


@triton.jit
def w4a16_gemm_kernel(a_ptr, b_ptr, b_scale_ptr, b_gs_ptr, c_ptr, M,
                      N: tl.constexpr, K: tl.constexpr, VEC: tl.constexpr, SWAP_AB: tl.constexpr,
                      SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] = A[M, K] @ dequant(B[N, K/2], scales[N, K/VEC])^T (layouts in the
    module docstring). Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K); with
    SPLIT_K > 1, c_ptr is the fp32 workspace [SPLIT_K, M, N].
    Targets: sm_90a (wgmma), sm_100a (tcgen05)."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    KB: tl.constexpr = K // VEC
    STEPS: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    PER_SPLIT: tl.constexpr = (STEPS + SPLIT_K - 1) // SPLIT_K
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K // 2], strides=[K // 2, 1],
                                       block_shape=[BLOCK_N, BLOCK_K // 2])
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    s_rows = b_scale_ptr + rn.to(tl.int64)[:, None] * KB  # [BLOCK_N, 1] row starts of the scales
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(pid_k * PER_SPLIT, tl.minimum((pid_k + 1) * PER_SPLIT, STEPS)):
        a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])                     # bf16 [BLOCK_M, BLOCK_K]
        wq = b_desc.load([pid_n * BLOCK_N, kt * (BLOCK_K // 2)])             # u8 [BLOCK_N, BLOCK_K/2]
        kb = kt * (BLOCK_K // VEC) + tl.arange(0, BLOCK_K // VEC)
        ws = tl.load(s_rows + kb[None, :], mask=(rn < N)[:, None] & (kb < KB)[None, :], other=0.0)
        w = fp4_dequant(wq, ws, BLOCK_N, BLOCK_K, VEC, VEC == 32)           # bf16 [BLOCK_N, BLOCK_K]
        if SWAP_AB:
            acc = tl.dot(w, a.T, acc)
        else:
            acc = tl.dot(a, w.T, acc)
    if SWAP_AB:
        acc = acc.T
    if VEC == 16:  # NVFP4: w = e2m1 * s / g
        acc = acc / tl.load(b_gs_ptr)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptr + pid_k.to(tl.int64) * M * N + offs, acc, mask=mask)


@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, M, N: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """C[M, N] = sum over s of workspace[s, M, N] (fp32, s in order), cast to C's dtype.
    Grid: (cdiv(M * N, BLOCK),). Targets: sm_90a, sm_100a."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def launch_w4a16(a: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, b_global: torch.Tensor | None = None,
                 *, name: str, config: dict | None = None, out: torch.Tensor | None = None,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """a bf16 [M, K], b u8 [N, K/2], b_scale [N, K/VEC] (+ NVFP4 global (1,)) -> C [M, N]."""
    kd = _DEFS[name]
    cfg = {**kd.default_config, **(config or {})}
    vec = 16 if name.endswith("nvfp4") else 32
    (m, k), n = a.shape, b.shape[0]
    if a.dtype != torch.bfloat16 or b.shape[1] * 2 != k or tuple(b_scale.shape) != (n, k // vec):
        raise ValueError(f"{name}: expected bf16 A [M, K], B [N, K/2], scales [N, K/{vec}]; got "
                         f"{a.dtype} {tuple(a.shape)}, {tuple(b.shape)}, {tuple(b_scale.shape)}")
    if a.device.type == "cuda" and k % 32:
        raise ValueError(f"{name}: TMA needs 16-byte rows, K={k} is not a multiple of 32")
    g = (b_global if b_global is not None else torch.ones(1)).reshape(1).to(device=a.device, dtype=torch.float32)
    c = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=a.device)
    split = cfg["SPLIT_K"]
    dst = c if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=a.device)
    fn = pick(w4a16_gemm_kernel, a, b, c)
    fn[kd.grid(m, n, k, cfg)](a.contiguous(), b.contiguous(), b_scale.contiguous(), g, dst, m, n, k, vec,
                              cfg["SWAP_AB"], split, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"],
                              cfg["GROUP_M"], **compile_options(cfg))
    if split > 1:
        red = KERNELS_REDUCE
        pick(splitk_reduce_kernel, c)[red.grid(m, n, k, cfg)](
            dst, c, m, n, split, cfg.get("REDUCE_BLOCK", 1024), num_warps=4)
    return c


# ----------------------------------------------------------------------------- registry

# M <= 16 (decode): weight rows on the MMA's M side, tokens on its N side, K split 4 ways.
DECODE_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "SPLIT_K": 4, "SWAP_AB": True,
                 "num_warps": 4, "num_stages": 4}
PREFILL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": False,
                  "num_warps": 4, "num_stages": 3}
_DEFS: dict[str, KernelDef] = {}


def _constexprs(vec):
    return lambda n, k, c: {"N": n, "K": k, "VEC": vec, "SWAP_AB": c["SWAP_AB"], "SPLIT_K": c["SPLIT_K"],
                            "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"],
                            "GROUP_M": c["GROUP_M"]}


def _signature(vec):
    def sig(n, k, c):
        out = "*fp32" if c["SPLIT_K"] > 1 else "*" + c.get("OUT_DTYPE", "bf16")
        types = {"a_ptr": "*bf16", "b_ptr": "*u8", "b_scale_ptr": "*fp8e4nv" if vec == 16 else "*u8",
                 "b_gs_ptr": "*fp32", "c_ptr": out, "M": "i32"}
        return signature_for(w4a16_gemm_kernel, types, _constexprs(vec)(n, k, c))
    return sig


def _grid(m, n, k, c):
    return (cdiv(m, c["BLOCK_M"]) * cdiv(n, c["BLOCK_N"]), c["SPLIT_K"])


def _smem(vec):
    def smem(c):
        a = 2 * c["BLOCK_M"] * c["BLOCK_K"]
        b = c["BLOCK_N"] * c["BLOCK_K"] // 2
        w = 2 * c["BLOCK_N"] * c["BLOCK_K"]  # the dequantized bf16 tile staged for the MMA
        return c["num_stages"] * (a + b) + w + 4 * c["BLOCK_M"] * c["BLOCK_N"]
    return smem


def _bytes(vec):
    return lambda m, n, k: 2.0 * m * k + n * k / 2 + n * k / vec + 2.0 * m * n


for _name, _fmt, _vec in (("w4a16_gemm_nvfp4", "nvfp4a16", 16), ("w4a16_gemm_mxfp4", "mxfp4a16", 32)):
    _DEFS[_name] = register_kernel(KernelDef(
        name=_name, fn=w4a16_gemm_kernel, kind="gemm", formats=(_fmt,), targets=("sm_90a", "sm_100a"),
        signature=_signature(_vec), constexprs=_constexprs(_vec), grid=_grid, smem_bytes=_smem(_vec),
        flops=lambda m, n, k: 2.0 * m * n * k, bytes_moved=_bytes(_vec),
        knobs=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "SWAP_AB", "num_warps", "num_stages"),
        default_config=dict(PREFILL_CONFIG), presets={"decode": DECODE_CONFIG, "prefill": PREFILL_CONFIG},
        followup="splitk_reduce",
        launch=lambda *args, _name=_name, **kw: launch_w4a16(*args, name=_name, **kw)))

KERNELS_REDUCE = register_kernel(KernelDef(
    name="splitk_reduce", fn=splitk_reduce_kernel, kind="reduce", formats=("nvfp4a16", "mxfp4a16"),
    targets=("sm_90a", "sm_100a"),
    signature=lambda n, k, c: signature_for(splitk_reduce_kernel, {
        "ws_ptr": "*fp32", "c_ptr": "*" + c.get("OUT_DTYPE", "bf16"), "M": "i32"},
        {"N": n, "SPLIT_K": c["SPLIT_K"], "BLOCK": c.get("REDUCE_BLOCK", 1024)}),
    constexprs=lambda n, k, c: {"N": n, "SPLIT_K": c["SPLIT_K"], "BLOCK": c.get("REDUCE_BLOCK", 1024)},
    grid=lambda m, n, k, c: (cdiv(m * n, c.get("REDUCE_BLOCK", 1024)),), smem_bytes=lambda c: 0,
    # one add per partial; bytes for SPLIT_K = 2 (fp32 partials in, bf16 out): scale reads by SPLIT_K / 2
    flops=lambda m, n, k: 2.0 * m * n, bytes_moved=lambda m, n, k: 10.0 * m * n,
    knobs=("REDUCE_BLOCK",), default_config={"SPLIT_K": 2, "REDUCE_BLOCK": 1024, "num_warps": 4, "num_stages": 1}))
