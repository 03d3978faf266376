"""Plain-torch references for the Triton kernel tests, built only from
`tfcompile.kernels.formats` (impl="reference", the specification).

GEMM reference: dequantize both operands to fp32 with `formats.dequantize` /
`dequantize_fp8_act`, then one fp32 matmul.

GEMM tolerance (fp32 outputs): kernel and reference sum the same K products
in different orders and round the scale multiplications differently. Every
dequantized operand element is a short float (E2M1/E4M3 times a power of two or
an E4M3 scale) so the products are exact, except FP8's fp32 per-tensor/channel
scales and NVFP4's s/g quotient, each one rounding (relative 2^-24) per use.
The worst case for a K-term fp32 sum in any order is (K-1)*2^-24 * sum|a*b|
(Higham's gamma_K), so two computations differ by at most
    2 * (K + 8) * 2^-24 * (|A| @ |B|^T)
(+8 covers the few scale roundings). That is tight -- 3e-5 of sum|a*b| at
K = 256 -- and exact-arithmetic bugs (a wrong scale, a missed K block, a
swapped nibble) are orders of magnitude larger.
"""

from __future__ import annotations

import torch

from tfcompile.kernels import formats as F

U32 = 2.0 ** -24


def assert_gemm_close(out: torch.Tensor, a_deq: torch.Tensor, b_deq: torch.Tensor) -> None:
    """out [M, N] (fp32) against a_deq @ b_deq^T within the bound above."""
    k = a_deq.shape[1]
    ref = a_deq.float() @ b_deq.float().T
    bound = 2 * (k + 8) * U32 * (a_deq.double().abs() @ b_deq.double().abs().T)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all(), "non-finite output (an unwritten tile?)"
    err = (out.double() - ref.double()).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max |err| {err.max().item():.3g} exceeds the bound by {worst:.3g}"


def assert_bf16_store(out_bf16: torch.Tensor, out_f32: torch.Tensor) -> None:
    """The bf16 output equals the fp32 output rounded to bf16 within one bf16
    ulp (2^-7 relative): the interpreter truncates, a GPU rounds to nearest."""
    assert out_bf16.dtype == torch.bfloat16
    err = (out_bf16.float() - out_f32).abs()
    assert (err <= out_f32.abs() * 2.0 ** -7).all()


def nan_out(m: int, n: int) -> torch.Tensor:
    """Output buffer pre-filled with NaN, so a tile the kernel never writes fails."""
    return torch.full((m, n), float("nan"))


def bf16_input(m: int, k: int, gen: torch.Generator, scale: float = 3.0) -> torch.Tensor:
    """Activations: gaussian with a few outliers, bf16."""
    x = torch.randn(m, k, generator=gen) * scale
    x[:, ::37] *= 8  # outliers, so blocks differ in scale
    return x.bfloat16()


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    return F.to_blackwell_scale_layout(scales)
