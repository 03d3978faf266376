"""Hypothesis property tests: random shapes, magnitudes 1e-6..1e4 with outliers,
checked against ml_dtypes oracles and format invariants."""

import os

import ml_dtypes
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcompile.kernels.formats import (decode_e2m1, dequantize, encode_e2m1, pack_fp4, quantize_fp8,
                                       quantize_mxfp4, quantize_mxfp8, quantize_nvfp4, unpack_fp4)

from fmt_oracles import DTYPES, ml_e2m1_codes

SET = settings(max_examples=int(os.environ.get("TFC_HYPOTHESIS_EXAMPLES", 30)), deadline=None, database=None)


@st.composite
def weights(draw, block=32, max_rows=24, max_kb=6):
    rows = draw(st.integers(1, max_rows))
    kb = draw(st.integers(1, max_kb))
    dtype = draw(st.sampled_from(DTYPES))
    mag = draw(st.sampled_from([1e-6, 1e-3, 1.0, 1e2]))
    seed = draw(st.integers(0, 2**20))
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, kb * block, generator=g) * mag
    n_out = draw(st.integers(0, 3))
    for _ in range(n_out):  # outliers of 1e4
        w.view(-1)[int(torch.randint(w.numel(), (1,), generator=g))] = 1e4 * draw(st.sampled_from([1, -1]))
    return w.to(dtype)


@SET
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=64))
def test_encode_e2m1_equals_ml_dtypes(xs):
    x = torch.tensor(xs, dtype=torch.float32)
    assert torch.equal(encode_e2m1(x), ml_e2m1_codes(x))


@SET
@given(st.binary(min_size=1, max_size=64))
def test_pack_unpack_roundtrip(b):
    packed = torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()
    assert torch.equal(pack_fp4(unpack_fp4(packed)), packed)
    assert unpack_fp4(packed)[0::2].tolist() == [v & 0xF for v in b]  # low nibble first


def _fp4_error_bound(w, q, group):
    """|x - x_hat| <= half the E2M1 step at x's magnitude, or the clip distance."""
    x = w.float().reshape(-1, group)
    back = dequantize(q).reshape(-1, group)
    s = (back.abs().amax(1, keepdim=True) / 6).clamp(min=1e-38)  # the block's unit (upper bound)
    return x, back, s


@SET
@given(weights(block=32))
def test_mxfp4_properties(w):
    for rule in ("floor", "ceil"):
        q = quantize_mxfp4(w, rule=rule)
        x = w.float().reshape(-1, 32)
        scale = torch.exp2(q.scale.float().reshape(-1, 1) - 127)
        back = dequantize(q).reshape(-1, 32)
        # decode equals E2M1 value x scale (ml_dtypes oracle on the same codes)
        ml = np.frombuffer(unpack_fp4(q.data).numpy().tobytes(), dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
        assert torch.equal(back, torch.from_numpy(ml.astype(np.float32)).reshape(-1, 32) * scale)
        err = (x - back).abs()
        y = x.abs() / scale                                  # magnitude in element units
        step = torch.where(y < 2, 0.5, torch.where(y < 4, 1.0, 2.0)) * scale
        clip = (x.abs() - 6 * scale).clamp(min=0)
        assert (err <= step / 2 + clip + 1e-30).all()
        if rule == "ceil":
            assert (clip == 0).all()                          # ceil never clips


@SET
@given(weights(block=16))
def test_nvfp4_properties(w):
    q = quantize_nvfp4(w)
    assert q.scale.float().isfinite().all() and (q.scale.float() > 0).all()
    assert q.global_scale.isfinite().all() and (q.global_scale > 0).all()
    back = dequantize(q)
    assert back.isfinite().all()
    # block scales saturate at 448, so |x_hat| <= 6 * 448 / g (fp32 rounding of g aside)
    assert back.abs().max() <= 2688 / q.global_scale * (1 + 1e-6)
    rel = (back - w.float()).norm() / w.float().norm().clamp(min=1e-30)
    assert rel < 0.35


@SET
@given(weights(block=32), st.sampled_from(["tensor", "channel", "block"]))
def test_fp8_properties(w, gran):
    q = quantize_fp8(w, gran)
    assert q.scale.isfinite().all() and (q.scale > 0).all()
    back = dequantize(q)
    x = w.float()
    # per element: RNE to 3 mantissa bits -> relative error <= 2^-4 for normals,
    # absolute <= 2^-10 * scale for E4M3 subnormals
    from tfcompile.kernels.formats.qtensor import expand_block_scale
    s = {"tensor": lambda: q.scale.reshape(1, 1), "channel": lambda: q.scale,
         "block": lambda: expand_block_scale(q.scale, q.shape, q.block)}[gran]()
    assert ((back - x).abs() <= x.abs() * 2 ** -4 + 2 ** -10 * s + 1e-30).all()


@SET
@given(weights(block=32))
def test_mxfp8_never_clips_with_ceil(w):
    q = quantize_mxfp8(w, rule="ceil")
    back = dequantize(q)
    assert ((back - w.float()).abs() <= w.float().abs() * 2 ** -4 + 2 ** -10 * 2.0 ** (q.scale.float().repeat_interleave(32, -1) - 127) + 1e-30).all()


def test_decode_e2m1_is_sign_symmetric():
    codes = torch.arange(8, dtype=torch.uint8)
    assert torch.equal(decode_e2m1(codes | 8), -decode_e2m1(codes))
