"""Stand-in kernels for the tuning/emission/runtime tests: tiny Triton GEMMs registered
under test-only names, so the tests do not depend on which real kernels exist.

- `standin_bf16_gemm`: y[M, N] (fp32) = x[M, K] (bf16) @ w[N, K]^T (bf16), every scheme
  (a weight-only, bf16-MMA kernel by tfcompile.tune.registry.mma_class);
- `standin_fp8_gemm`: the same with e4m3 x and w, for the fp8 schemes (fp8 MMA).
Both support SPLIT_K (fp32 atomics) and run on both targets.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tfcompile.kernels.triton.registry import KERNELS, KernelDef
from tfcompile.schemes import SCHEMES

BF16, FP8 = "standin_bf16_gemm", "standin_fp8_gemm"
KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SPLIT_K")


@triton.jit
def standin_gemm(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(tl.program_id(2) * BLOCK_K, K, BLOCK_K * SPLIT_K):
        a = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * K + (k0 + rk)[:, None],
                    mask=(rn[None, :] < N) & ((k0 + rk)[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc)
    out = y_ptr + rm[:, None] * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(out, acc, mask=mask)
    else:
        tl.atomic_add(out, acc, mask=mask)


def _kernel(name: str, dtype: str, elem_bytes: int, formats: tuple[str, ...]) -> KernelDef:
    return KernelDef(
        name=name, fn=standin_gemm, kind="gemm", formats=formats, targets=("sm_90a", "sm_100a"),
        signature=lambda n, k, c: {"x_ptr": dtype, "w_ptr": dtype, "y_ptr": "*fp32", "M": "i32",
                                   "N": "constexpr", "K": "constexpr", "BLOCK_M": "constexpr",
                                   "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "SPLIT_K": "constexpr"},
        constexprs=lambda n, k, c: {"N": n, "K": k, "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"],
                                    "BLOCK_K": c["BLOCK_K"], "SPLIT_K": c.get("SPLIT_K", 1)},
        grid=lambda m, n, k, c: (triton.cdiv(m, c["BLOCK_M"]), triton.cdiv(n, c["BLOCK_N"]), c.get("SPLIT_K", 1)),
        smem_bytes=lambda c: c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * elem_bytes,
        flops=lambda m, n, k: 2.0 * m * n * k,
        bytes_moved=lambda m, n, k: float((m * k + n * k) * elem_bytes + m * n * 4),
        knobs=KNOBS,
        default_config={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
                        "SPLIT_K": 1},
    )


def register() -> tuple[str, str]:
    """Register both stand-ins (idempotent); returns their names."""
    fp8 = tuple(s for s in SCHEMES if s.startswith("fp8"))
    if BF16 not in KERNELS:
        KERNELS[BF16] = _kernel(BF16, "*bf16", 2, tuple(SCHEMES))
    if FP8 not in KERNELS:
        KERNELS[FP8] = _kernel(FP8, "*fp8e4nv", 1, fp8)
    return BF16, FP8


def unregister() -> None:
    KERNELS.pop(BF16, None)
    KERNELS.pop(FP8, None)
