"""Activation quantization kernels, bit-exact against tfcompile.kernels.formats
(impl="reference"): codes and scales, row-major and Blackwell-swizzled, ragged
M, K at block boundaries, plus crafted edge values for the bit-level encoders.
All on CPU tensors under Triton's interpreter (conftest.py)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton_refs import bf16_input, swizzle

from tfcompile.kernels import formats as F
from tfcompile.kernels.triton import KERNELS
from tfcompile.kernels.triton.common import bf16_to_f32, e2m1_code, e4m3_code, swizzled_numel
from tfcompile.kernels.triton.interpret import launchable

SHAPES = [(1, 32), (7, 96), (129, 256)]  # ragged M; K = one MX block, a partial 128-group, two groups
BIG = {"BLOCK_M": 64}  # fewer programs: the interpreter runs each in Python


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _edge_rows(k: int) -> torch.Tensor:
    """Rows that hit the special cases: zeros, bf16 subnormals, huge values, ties."""
    rows = torch.zeros(4, k)
    rows[1] = (torch.arange(k) % 7 - 3) * 2.0 ** -131              # bf16 subnormals (block amax < 2^-126)
    rows[2] = torch.linspace(-1, 1, k) * 3e38                      # near bf16 max
    rows[3, ::2], rows[3, 1::2] = 6.0, 7.0                          # E2M1 top / MX floor clipping
    return rows.bfloat16()


@pytest.mark.parametrize("m,k", SHAPES)
@pytest.mark.parametrize("mode", ["token", "group", "static"])
def test_fp8_act_quant_bit_exact(m, k, mode, gen):
    x = bf16_input(m, k, gen)
    x[0, :16] = 0  # zero prefix; row 0 of M=1 still has data
    ref_mode = {"token": "per_token", "group": "per_group", "static": "static"}[mode]
    static = torch.tensor([0.02]) if mode == "static" else None  # values above 448*0.02 saturate
    q, s = KERNELS[f"act_quant_fp8_{mode}"].launch(x, static, config=BIG if mode != "token" else None)
    rq, rs = F.quantize_fp8_act(x, ref_mode, scale=static)
    assert torch.equal(_bytes(q), _bytes(rq))
    assert torch.equal(s, rs)


def test_fp8_act_quant_edges():
    x = torch.cat([_edge_rows(256), torch.full((1, 256), 1e-38).bfloat16()])
    for mode, ref_mode in (("token", "per_token"), ("group", "per_group")):
        q, s = KERNELS[f"act_quant_fp8_{mode}"].launch(x)
        rq, rs = F.quantize_fp8_act(x, ref_mode)
        assert torch.equal(_bytes(q), _bytes(rq)) and torch.equal(s, rs), mode


@pytest.mark.parametrize("m,k", SHAPES)
@pytest.mark.parametrize("elem", ["fp4", "fp8"])
@pytest.mark.parametrize("swizzled", [True, False])
def test_mx_act_quant_bit_exact(m, k, elem, swizzled, gen):
    x = bf16_input(m, k, gen)
    kd = KERNELS[f"act_quant_mx{elem}"]
    assert kd.default_config["CEIL"] == ((F.DEFAULT_MXFP8_RULE if elem == "fp8" else F.DEFAULT_MX_RULE) == "ceil")
    # garbage-filled buffers: the kernel itself must write every byte, swizzle padding included
    data = torch.full((m, k // 2 if elem == "fp4" else k), 0xAB, dtype=torch.uint8)
    scales = torch.full((swizzled_numel(m, k // 32),) if swizzled else (m, k // 32), 0xAB, dtype=torch.uint8)
    out = (data if elem == "fp4" else data.view(torch.float8_e4m3fn), scales)
    q, s = kd.launch(x, config={**BIG, "SWIZZLE": swizzled}, out=out)
    ref = F.quantize_mx_act(x, elem, impl="reference")
    assert torch.equal(_bytes(q), _bytes(ref.data))
    assert torch.equal(s, swizzle(ref.scale) if swizzled else ref.scale)


@pytest.mark.parametrize("elem", ["fp4", "fp8"])
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mx_act_quant_rules_and_edges(elem, rule):
    # amax significands exactly at / just above the ceil thresholds (1.5, 1.75), floor clipping, zeros
    k = 128
    x = _edge_rows(k).float()
    x = torch.cat([x, torch.tensor([1.5, 1.5078125, 1.75, 1.7578125]).repeat_interleave(32)[None] * 4])
    x = x.bfloat16()
    q, s = KERNELS[f"act_quant_mx{elem}"].launch(x, config={"CEIL": rule == "ceil", "SWIZZLE": False})
    ref = F.quantize_mx_act(x, elem, rule=rule, impl="reference")
    assert torch.equal(_bytes(q), _bytes(ref.data)) and torch.equal(s, ref.scale)


@pytest.mark.parametrize("m,k", SHAPES + [(3, 48)])
@pytest.mark.parametrize("swizzled", [True, False])
def test_nvfp4_act_quant_bit_exact(m, k, swizzled, gen):
    x = bf16_input(m, k, gen)
    g = F.nvfp4_global_scale(x.float().abs().amax())
    q, s = KERNELS["act_quant_nvfp4"].launch(x, g, config={**BIG, "SWIZZLE": swizzled})
    ref = F.quantize_nvfp4_act(x, g, impl="reference")
    assert torch.equal(q, ref.data)
    assert torch.equal(_bytes(s), _bytes(swizzle(ref.scale) if swizzled else ref.scale))


def test_nvfp4_act_quant_edges():
    """Zero blocks (scale 1.0), blocks whose scale underflows (-> 1.0), subnormal
    E4M3 scales, and a calibrated global scale the live amax exceeds (scales saturate)."""
    x = torch.cat([_edge_rows(64).float()[:2], torch.full((1, 64), 1e-4), torch.randn(1, 64) * 50]).bfloat16()
    for g in (F.nvfp4_global_scale(torch.tensor(1.0)), F.nvfp4_global_scale(torch.tensor(20.0))):
        q, s = KERNELS["act_quant_nvfp4"].launch(x, g, config={"SWIZZLE": False})
        ref = F.quantize_nvfp4_act(x, g, impl="reference")
        assert torch.equal(q, ref.data) and torch.equal(_bytes(s), _bytes(ref.scale))


# ----------------------------------------------------------------------------- the bit-level helpers


@triton.jit
def _encode_kernel(x_ptr, e4_ptr, e2_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(e4_ptr + offs, e4m3_code(x), mask=mask)
    tl.store(e2_ptr + offs, e2m1_code(x), mask=mask)


def _crafted_fp32() -> torch.Tensor:
    e4 = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # all finite magnitudes
    mid = (e4[1:] + e4[:-1]) / 2                                                    # every RNE tie
    e2 = F.E2M1_VALUES[:8]
    mid2 = (e2[1:] + e2[:-1]) / 2
    base = torch.cat([e4, mid, mid2, e2, torch.tensor([448, 456, 463.9, 464, 480, 1e6, 2.0 ** -10, 2.0 ** -11,
                                                        1e-40, 3e-39, 6.5, 7.0, 1e30])])
    nudged = torch.cat([base, torch.nextafter(base, torch.tensor(0.0)), torch.nextafter(base, torch.tensor(1e38))])
    return torch.cat([nudged, -nudged, torch.tensor([-0.0])])


def test_encoders_match_reference_on_ties_and_ranges():
    x = _crafted_fp32()
    n = x.numel()
    e4 = torch.empty(n, dtype=torch.uint8)
    e2 = torch.empty(n, dtype=torch.uint8)
    launchable(_encode_kernel)[(triton.cdiv(n, 1024),)](x, e4, e2, n, 1024)
    assert torch.equal(e4, _bytes(F.cast_e4m3(x)))
    assert torch.equal(e2, F.encode_e2m1(x))


def test_bf16_decode_is_exact_including_subnormals():
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x[~torch.isnan(x.float())]
    out = torch.empty(x.numel())
    launchable(_decode_kernel)[(triton.cdiv(x.numel(), 8192),)](x, out, x.numel(), 8192)
    assert torch.equal(out, x.float())


@triton.jit
def _decode_kernel(x_ptr, f_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(f_ptr + offs, bf16_to_f32(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)
