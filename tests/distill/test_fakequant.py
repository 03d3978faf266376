"""Fake quantization equals what pack writes and tfcompile eval emulates; STE gradients."""

from __future__ import annotations

import pytest
import torch

from tfcompile.distill.fakequant import (act_fake_quant_fn, fake_quant_weight, quant_dequant_weight, ste,
                                         to_storage)
from tfcompile.kernels import formats as F
from tfcompile.schemes import SCHEMES

FORMATS = ["nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"]


def _weight(seed=0, n=64, k=256):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.02).bfloat16()


@pytest.mark.parametrize("fmt", FORMATS)
def test_weight_fake_quant_is_packs_quantization(fmt):
    """Same values as passes/quantize/rtn.py (the fused kernels pack runs), for both impls."""
    from tfcompile.distill.fakequant import group_global_scale
    from tfcompile.ir import Program
    from tfcompile.passes.quantize.rtn import quantize_weight

    scheme = SCHEMES[fmt]
    ws = [_weight(0), _weight(1)]  # a two-member fusion group
    gscale = scheme.weights.group_global_scale(ws)  # pack's (rtn.run_rtn)
    if scheme.weight == "nvfp4":  # distillation's, from its float32 master weights: the same value
        assert torch.equal(group_global_scale(scheme.weights, [w.float() for w in ws]), gscale)
    rule = F.DEFAULT_MXFP8_RULE if scheme.weight == "mxfp8" else F.DEFAULT_MX_RULE
    program = Program(scheme, "rtn", (), {}, rule, 0)
    for w in ws:
        packed = F.dequantize(quantize_weight(w, program, gscale, "w", torch.bfloat16))
        for impl in ("reference", "auto"):
            ours = quant_dequant_weight(w.float(), scheme.weights, gscale, program.mx_rule, torch.bfloat16, impl)
            assert torch.equal(ours, packed), (fmt, impl)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"])
def test_activation_fake_quant_is_evals_emulation(fmt):
    from tfcompile.evaluate.actquant import act_quantizer
    from tfcompile.kernels.formats import nvfp4_global_scale, round_scale_up

    scheme = SCHEMES[fmt]
    x = torch.randn(2, 8, 256) * 3
    amax = 7.5
    stored = None  # the artifact's static scale, as rtn.ct_tensors writes it
    if scheme.act == "nvfp4":
        stored = nvfp4_global_scale(torch.tensor([amax]))
    elif scheme.act == "fp8-static":
        stored = round_scale_up(torch.tensor([amax / 448]), torch.bfloat16)
    ref = act_quantizer(scheme.act, "m", stored)(x)
    for impl in ("reference", "auto"):
        assert torch.equal(act_fake_quant_fn(scheme.act, amax, "m", torch.bfloat16, impl)(x), ref)
    assert act_fake_quant_fn(None, None, "m") is None


def test_straight_through_gradient():
    x = torch.randn(4, 32, requires_grad=True)
    y = ste(x, lambda t: t.round())
    assert torch.equal(y, x.detach().round())
    (y * torch.arange(32.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(32.0).expand(4, 32))


def test_fake_quant_weight_and_storage_rounding_pass_gradients():
    w = (torch.randn(16, 64) * 0.02).requires_grad_()
    scheme = SCHEMES["nvfp4a16"]
    ws = to_storage(w, torch.bfloat16)
    assert torch.equal(ws, w.detach().bfloat16().float())
    g = F.nvfp4_global_scale(ws.detach().abs().amax().reshape(1))
    q = fake_quant_weight(ws, scheme.weights, g, "floor", torch.bfloat16)
    assert not torch.equal(q, ws.detach())  # it did quantize
    q.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))
