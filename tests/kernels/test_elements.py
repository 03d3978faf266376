"""Element codecs against ml_dtypes and torch: exhaustive over every code."""

import ml_dtypes
import numpy as np
import pytest
import torch

from tfcompile.kernels.formats import (E2M1_MAX, E2M1_VALUES, E4M3_MAX, cast_e4m3, decode_e2m1, round_e2m1,
                                       decode_e8m0, encode_e2m1, encode_e8m0)

from fmt_oracles import ml_e2m1_codes, ml_e4m3_bytes, ml_e8m0_values


def test_constants_match_ml_dtypes():
    assert E2M1_MAX == float(ml_dtypes.finfo(ml_dtypes.float4_e2m1fn).max)
    assert E4M3_MAX == float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) == torch.finfo(torch.float8_e4m3fn).max


def test_all_16_e2m1_codes_decode_like_ml_dtypes():
    want = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = decode_e2m1(torch.arange(16, dtype=torch.uint8)).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # -0 included
    assert torch.equal(E2M1_VALUES.view(torch.int32), torch.from_numpy(want).view(torch.int32))


def test_all_16_e2m1_codes_roundtrip():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encode_e2m1(decode_e2m1(codes)), codes)


def _e2m1_probe_points() -> torch.Tensor:
    """Every E2M1 value, every midpoint (tie), one ulp either side, and beyond 6."""
    v = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6])
    mids = (v[1:] + v[:-1]) / 2
    pts = torch.cat([v, mids, torch.tensor([6.5, 7.0, 8.0, 1e4, 3e38])])
    ulp = torch.cat([torch.nextafter(pts, torch.tensor(-1.0)), torch.nextafter(pts, torch.tensor(1e39))])
    allp = torch.cat([pts, ulp]).abs()
    return torch.cat([allp, -allp])


def test_encode_e2m1_ties_and_saturation_match_ml_dtypes():
    x = _e2m1_probe_points()
    assert torch.equal(encode_e2m1(x), ml_e2m1_codes(x))


def test_encode_e2m1_random_matches_ml_dtypes():
    x = torch.randn(100_000) * torch.logspace(-3, 2, 100_000)
    assert torch.equal(encode_e2m1(x), ml_e2m1_codes(x))


def test_e2m1_spec_golden_ties():
    # OCP MX v1.0 RNE: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
    assert decode_e2m1(encode_e2m1(x)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]


def test_all_256_e4m3_codes_decode_like_ml_dtypes_and_torch():
    codes = torch.arange(256, dtype=torch.uint8)
    torch_vals = codes.view(torch.float8_e4m3fn).float()
    ml_vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    same = np.isnan(ml_vals) | (torch_vals.numpy() == ml_vals)
    assert same.all() and np.array_equal(np.isnan(ml_vals), torch_vals.isnan().numpy())
    finite = ~torch_vals.isnan()  # every finite code survives cast_e4m3 unchanged
    assert torch.equal(cast_e4m3(torch_vals[finite]).view(torch.uint8), codes[finite])


def test_cast_e4m3_rne_ties_subnormals_saturation():
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    v = vals[~vals.isnan()].unique()
    mids = (v[1:] + v[:-1]) / 2
    x = torch.cat([v, mids, torch.nextafter(mids, torch.tensor(1e9)), torch.nextafter(mids, torch.tensor(-1e9)),
                   torch.tensor([449.0, 464.0, 465.0, 1e6, -1e6, 3e38, 2.0**-10, 2.0**-11, 1e-30])])
    assert torch.equal(cast_e4m3(x).view(torch.uint8), ml_e4m3_bytes(x))
    assert float(cast_e4m3(torch.tensor([1e6])).float()) == 448.0  # saturates, no NaN


def test_cast_e4m3_random_matches_ml_dtypes():
    x = torch.randn(100_000) * torch.logspace(-4, 3, 100_000)
    assert torch.equal(cast_e4m3(x).view(torch.uint8), ml_e4m3_bytes(x))


def test_all_256_e8m0_codes_decode_like_ml_dtypes():
    want = ml_e8m0_values()
    got = decode_e8m0(torch.arange(256, dtype=torch.uint8)).numpy()
    assert np.isnan(got[255]) and np.isnan(want[255])
    assert np.array_equal(got[:255].view(np.uint32), want[:255].view(np.uint32))


def test_encode_e8m0_all_exponents():
    e = torch.arange(-127, 128)
    codes = encode_e8m0(e)
    assert codes.tolist() == list(range(255))
    want = ml_e8m0_values()[:255]
    assert np.array_equal(np.exp2(e.numpy().astype(np.float64)).astype(np.float32), want)
    with pytest.raises(ValueError):
        encode_e8m0(torch.tensor([128]))


def test_round_e2m1_equals_ml_dtypes_on_every_bf16_value():
    """The fast value rounding (round_e2m1, used by GPTQ, learned rounding and the output-scale
    search) against ml_dtypes' RNE saturating cast to float4_e2m1fn and back, and against the
    spec's encode/decode pair: every non-NaN bf16 (infinities, subnormals, -0 and every E2M1
    midpoint included), and random float32 between the grid points."""
    y = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    y = torch.cat([y[~y.isnan()], torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 4])
    got = round_e2m1(y)
    oracle = torch.from_numpy(y.numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float32))
    assert torch.equal(got, oracle) and torch.equal(torch.signbit(got), torch.signbit(oracle))
    assert torch.equal(got, decode_e2m1(encode_e2m1(y)))
    assert {0.25, 0.75, 2.5, 5.0, 7.0} <= set(y.abs().tolist())  # ties and saturation were visited
