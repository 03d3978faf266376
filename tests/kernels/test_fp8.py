"""FP8 E4M3 weights/activations against torch's float8 cast and ml_dtypes."""

import pytest
import torch

from tfcompile.kernels.formats import dequantize, dequantize_fp8_act, quantize_fp8, quantize_fp8_act

from fmt_oracles import DTYPES, heavy_tailed, ml_e4m3_bytes


def torch_oracle(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Saturating cast with torch's own float8 conversion (independent of our cast_e4m3)."""
    y = x.float() / s
    return torch.clamp(y, -448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_tensor(dtype):
    w = heavy_tailed((64, 200), seed=4).to(dtype)
    q = quantize_fp8(w, "tensor")
    s = w.float().abs().max() / 448
    assert q.scale.shape == (1,) and torch.equal(q.scale, s.reshape(1))
    assert torch.equal(q.data.view(torch.uint8), ml_e4m3_bytes(w.float() / s))
    assert torch.equal(q.data.view(torch.uint8), torch_oracle(w, s))


def test_per_channel_and_3d():
    w = torch.randn(4, 40, 72) * torch.logspace(-3, 3, 40)[:, None]
    q = quantize_fp8(w, "channel")
    s = w.abs().amax(-1, keepdim=True) / 448
    assert q.scale.shape == (4, 40, 1) and torch.equal(q.scale, s)
    assert torch.equal(q.data.view(torch.uint8), torch_oracle(w, s))
    qt = quantize_fp8(w, "tensor")  # per expert: [E, 1]
    assert qt.scale.shape == (4, 1)
    assert torch.equal(qt.data.view(torch.uint8), torch_oracle(w, w.abs().amax((1, 2)).reshape(4, 1, 1) / 448))


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (2, 130, 129)])
def test_per_block_ceil_grid(shape):
    w = torch.randn(*shape)
    q = quantize_fp8(w, "block")
    n, k = shape[-2:]
    nb, kb = -(-n // 128), -(-k // 128)
    assert q.scale.shape == (*shape[:-2], nb, kb) and q.block == (128, 128)
    for i in range(nb):          # loop oracle: each tile on its own, partial edges included
        for j in range(kb):
            tile = w[..., i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = tile.abs().amax((-2, -1)) / 448
            assert torch.equal(q.scale[..., i, j], s)
            got = q.data[..., i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].view(torch.uint8)
            assert torch.equal(got, torch_oracle(tile, s[..., None, None]))
    assert dequantize(q).shape == w.shape


def test_given_scale_and_dequant():
    w = torch.randn(8, 16)
    s = torch.tensor([0.01])
    q = quantize_fp8(w, scale=s)
    assert torch.equal(q.data.view(torch.uint8), torch_oracle(w, s))
    assert torch.equal(dequantize(q), q.data.float() * 0.01)


def test_zero_tensor_scale_is_one():
    for g in ("tensor", "channel", "block"):
        q = quantize_fp8(torch.zeros(3, 130), g)
        assert (q.scale == 1.0).all() and (dequantize(q) == 0).all()


def test_act_modes():
    x = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(0)) * 10
    x[0, 1] = 0
    d, s = quantize_fp8_act(x, "per_token")
    st = x.abs().amax(-1, keepdim=True) / 448
    st = torch.where(st == 0, 1.0, st)
    assert s.shape == (2, 5, 1) and torch.equal(s, st)
    assert torch.equal(d.view(torch.uint8), torch_oracle(x, st))
    d, s = quantize_fp8_act(x, "per_group")
    assert s.shape == (2, 5, 3)
    for gi in range(3):
        sl = x[..., gi * 128:(gi + 1) * 128]
        sg = sl.abs().amax(-1) / 448
        sg = torch.where(sg == 0, 1.0, sg)
        assert torch.equal(s[..., gi], sg)
        assert torch.equal(d[..., gi * 128:(gi + 1) * 128].view(torch.uint8), torch_oracle(sl, sg[..., None]))
    back = dequantize_fp8_act(d, s)
    # E4M3: 3 mantissa bits, half-ulp 2^-4 relative; below 2^-6 (subnormals) the spacing is
    # 2^-9, so the absolute error is at most half of it, 2^-10, times the group's scale.
    per_elem_scale = s.repeat_interleave(128, -1)[..., :300]
    assert ((back - x).abs() <= torch.maximum(x.abs() * 2 ** -4, per_elem_scale * 2 ** -10)).all()
    d, s = quantize_fp8_act(x, "static", scale=torch.tensor([0.05]))
    assert torch.equal(d.view(torch.uint8), torch_oracle(x, torch.tensor(0.05)))
