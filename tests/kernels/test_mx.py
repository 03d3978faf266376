"""MXFP4/MXFP8 against an independent oracle: per-block exponent from Python's
math.frexp (the OCP formula written out), elements cast by ml_dtypes."""

import math

import pytest
import torch

from tfcompile.kernels.formats import DEFAULT_MX_RULE, decode_e8m0, dequantize, quantize_mxfp4, quantize_mxfp8, unpack_fp4

from fmt_oracles import DTYPES, heavy_tailed, ml_e2m1_codes, ml_e4m3_bytes


def oracle_exponent(amax: float, elem: str, rule: str) -> int:
    """OCP MX v1.0 §6.3 (floor) / RCEIL (ceil), written with math.frexp and exact rationals."""
    if amax == 0:
        return 0
    emax, top = (2, 6.0) if elem == "fp4" else (8, 448.0)
    m, ex = math.frexp(amax)          # amax = m * 2^ex, m in [0.5, 1)
    e = (ex - 1) - emax               # floor(log2 amax) - emax_elem
    if rule == "ceil":              # smallest e with amax <= max_elem * 2^e
        while amax > top * 2.0 ** e:
            e += 1
    return max(-127, min(127, e))


def oracle_mx(w: torch.Tensor, elem: str, rule: str):
    x = w.float().reshape(-1, 32)
    exps = torch.tensor([oracle_exponent(float(a), elem, rule) for a in x.abs().amax(1)], dtype=torch.float64)
    y = (x.double() / torch.exp2(exps)[:, None]).float()
    data = ml_e2m1_codes(y) if elem == "fp4" else ml_e4m3_bytes(y)
    return data.reshape(w.shape), (exps + 127).to(torch.uint8).reshape(*w.shape[:-1], -1)


@pytest.mark.parametrize("rule", ["floor", "ceil"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_matches_oracle(rule, dtype):
    w = (heavy_tailed((16, 256), seed=1) * torch.logspace(-8, 4, 16)[:, None]).to(dtype)
    q = quantize_mxfp4(w, rule=rule, impl="reference")
    codes, scale = oracle_mx(w, "fp4", rule)
    assert torch.equal(q.scale, scale)
    assert torch.equal(unpack_fp4(q.data), codes)
    assert q.rule == rule and q.block == (32,) and q.granularity == "group"


@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mxfp8_matches_oracle(rule):
    w = heavy_tailed((16, 256), seed=2) * torch.logspace(-30, 30, 16)[:, None]
    q = quantize_mxfp8(w, rule=rule, impl="reference")
    data, scale = oracle_mx(w, "fp8", rule)
    assert torch.equal(q.scale, scale)
    assert torch.equal(q.data.view(torch.uint8), data)


def test_floor_rule_clips_and_ceil_does_not():
    # OCP MX v1.0 §6.3 (docs/formats.md "Block formats"): amax 7 -> floor scale 1 (7 saturates to 6); ceil scale 2 (7 -> 3.5 -> 4*2 = 8)
    w = torch.zeros(1, 32)
    w[0, 0] = 7.0
    f, c = quantize_mxfp4(w, rule="floor"), quantize_mxfp4(w, rule="ceil")
    assert int(f.scale) == 127 and float(dequantize(f)[0, 0]) == 6.0
    assert int(c.scale) == 128 and float(dequantize(c)[0, 0]) == 8.0
    # amax exactly 6 * 2^k is representable under both rules
    w[0, 0] = 6.0 * 2.0 ** -5
    assert int(quantize_mxfp4(w, rule="floor").scale) == int(quantize_mxfp4(w, rule="ceil").scale) == 127 - 5
    # MXFP8: 448 = 1.75 * 2^8 -> scale 1 under both; 449 clips under floor only
    w[0, 0] = 448.0
    assert int(quantize_mxfp8(w, rule="floor").scale) == int(quantize_mxfp8(w, rule="ceil").scale) == 127
    w[0, 0] = 480.0
    assert float(dequantize(quantize_mxfp8(w, rule="floor"))[0, 0]) == 448.0
    assert float(dequantize(quantize_mxfp8(w, rule="ceil"))[0, 0]) == 480.0


def test_all_zero_block_scale_is_one_and_extremes_clamp():
    w = torch.zeros(2, 64)
    w[1, 0] = 1e-40  # fp32 subnormal: exponent clamps at E8M0's 2^-127
    w[1, 33] = 3e38
    q = quantize_mxfp4(w)
    assert q.scale.tolist() == [[127, 127], [0, 127 + 125]]
    assert decode_e8m0(q.scale).isfinite().all() and (decode_e8m0(q.scale) > 0).all()


def test_default_rule_is_a_named_rule():
    assert DEFAULT_MX_RULE in ("floor", "ceil")
    assert quantize_mxfp4(torch.randn(4, 32)).rule == DEFAULT_MX_RULE
