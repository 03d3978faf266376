"""The facts a weight format states about itself (kernels/formats/quantizer.py) against what its
quantizer really stores: bits per weight from the bytes of a quantized tensor, element bits from
the stored data's dtype and packing, block scaling from the scale grid."""

from __future__ import annotations

import pytest
import torch

from tfcompile.kernels.formats.quantizer import WEIGHT_FORMATS, weight_quantizer

CASES = [("nvfp4", "group", ()), ("mxfp4", "group", ()), ("mxfp8", "group", ()),
         ("fp8", "tensor", ()), ("fp8", "channel", ()), ("fp8", "block", (128, 128))]


def test_every_registered_format_is_covered():
    assert {c[0] for c in CASES} == set(WEIGHT_FORMATS)


@pytest.mark.parametrize("fmt,granularity,block", CASES)
def test_bits_per_weight_is_what_the_artifact_stores(fmt, granularity, block):
    n, k = 256, 512
    wq = weight_quantizer(fmt, granularity, block)
    q = wq.quantize(torch.randn(n, k), scale_dtype=torch.bfloat16, impl="reference")
    data_bits = q.data.numel() * q.data.element_size() * 8 / (n * k)
    stored = wq.stored_scale(q, torch.bfloat16)
    scale_bits = stored.numel() * stored.element_size() * 8 / (n * k)
    assert data_bits == wq.element_bits
    if wq.block_scaled:  # one 8-bit scale per block along K
        assert tuple(stored.shape) == (n, k // wq.block[0]) and stored.element_size() == 1
        assert wq.bits_per_weight == data_bits + scale_bits
    else:  # FP8: per tensor / channel / 128x128 tile, under 0.01 bits per weight (here 1/16 for channel)
        assert wq.bits_per_weight == data_bits
        assert scale_bits < 0.07
