"""NVFP4 rules: global-scale conventions, block scales, ties, subnormal scales."""

import pytest
import torch

from tfcompile.kernels.formats import (dequantize, global_scale_from_modelopt, global_scale_to_modelopt,
                                       nvfp4_global_scale, quantize_nvfp4, quantize_nvfp4_act, unpack_fp4)

from fmt_oracles import ml_e2m1_codes, ml_e4m3_bytes


def test_global_scale_conventions():
    amax = torch.tensor(5.25)
    g = nvfp4_global_scale(amax)
    assert g.shape == (1,) and g.dtype == torch.float32
    assert float(g) == pytest.approx(448 * 6 / 5.25, rel=1e-7)  # compressed-tensors multiplier
    ws2 = global_scale_to_modelopt(g)
    assert float(ws2) == pytest.approx(5.25 / 2688, rel=1e-6)   # modelopt weight_scale_2 divisor
    assert torch.equal(global_scale_from_modelopt(torch.tensor([5.25 / 2688])), 1.0 / torch.tensor([5.25 / 2688]))
    assert float(nvfp4_global_scale(torch.tensor(0.0))) == 1.0   # all-zero tensor: never inf


def test_oracle_blocks():
    """Block scale = e4m3(amax_b/6*g) (ml_dtypes), codes = e2m1(x/(s/g)) (ml_dtypes)."""
    w = torch.randn(32, 128) * torch.logspace(-4, 1, 32)[:, None]
    q = quantize_nvfp4(w)
    g = 2688.0 / w.abs().max()
    amax_b = w.view(32, 8, 16).abs().amax(-1)
    s = ml_e4m3_bytes(amax_b / 6 * g)
    s = torch.where(s == 0, torch.tensor(0x38, dtype=torch.uint8), s)
    assert torch.equal(q.scale.view(torch.uint8), s)
    eff = s.view(torch.float8_e4m3fn).float() / g
    codes = ml_e2m1_codes(w.view(32, 8, 16) / eff[..., None]).view(32, 128)
    assert torch.equal(unpack_fp4(q.data), codes)


def test_shared_global_scale_for_fused_layers():
    q_proj, k_proj = torch.randn(64, 64), torch.randn(32, 64) * 5
    g = nvfp4_global_scale(torch.maximum(q_proj.abs().max(), k_proj.abs().max()))
    a, b = quantize_nvfp4(q_proj, global_scale=g), quantize_nvfp4(k_proj, global_scale=g)
    assert torch.equal(a.global_scale, g) and torch.equal(b.global_scale, g)
    fused = quantize_nvfp4(torch.cat([q_proj, k_proj]))  # same as quantizing the fused weight
    assert torch.equal(torch.cat([a.data, b.data]), fused.data)


def test_experts_get_one_global_each():
    w = torch.randn(3, 16, 64) * torch.tensor([1.0, 10.0, 100.0])[:, None, None]
    q = quantize_nvfp4(w)
    assert q.global_scale.shape == (3, 1)
    for e in range(3):
        qe = quantize_nvfp4(w[e])
        assert torch.equal(q.data[e], qe.data) and torch.equal(q.global_scale[e], qe.global_scale)
        assert torch.equal(dequantize(q)[e], dequantize(qe))


def test_subnormal_block_scales():
    """Blocks far below the tensor max get E4M3 subnormal scales (codes 1..7, 2^-9 steps)."""
    w = torch.zeros(1, 64)
    w[0, 0] = 2688.0                    # g = 1
    w[0, 16] = 6 * 2.0 ** -9            # s = 2^-9: smallest subnormal, code 0x01
    w[0, 32] = 6 * 3 * 2.0 ** -9        # code 0x03
    w[0, 48] = 6 * 2.0 ** -11           # rounds to 0 in E4M3 -> replaced by 1.0 (0x38)
    q = quantize_nvfp4(w)
    assert q.scale.view(torch.uint8).tolist() == [[0x7E, 0x01, 0x03, 0x38]]
    back = dequantize(q)
    assert back[0, 16] == w[0, 16] and back[0, 32] == w[0, 32] and back[0, 48] == 0


def test_ties_round_to_even():
    """Values landing exactly on E2M1 midpoints after scaling (block max 6 -> s = 1 with g = 448)."""
    g = torch.tensor([448.0])  # amax_b 6 -> 6/6*448 = 448 -> s = 448, eff = 1
    x = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0]])
    q = quantize_nvfp4(x, global_scale=g)
    assert dequantize(q).tolist() == [[6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, 0.0]]


def test_activation_path():
    x = torch.randn(2, 3, 64)
    g = nvfp4_global_scale(torch.tensor(8.0))
    q = quantize_nvfp4_act(x, g)
    assert q.data.shape == (2, 3, 32) and q.scale.shape == (2, 3, 4) and dequantize(q).shape == x.shape
    assert torch.equal(q.data.reshape(6, 32), quantize_nvfp4(x.reshape(6, 64), global_scale=g).data)
