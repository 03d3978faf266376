"""Quantize-dequantize SQNR per format on Gaussian and heavy-tailed weights.

Bounds: measured with this file's tensors (256x4096 bf16, N(0,1) seed 0 and
Student-t df=3 seed 1; torch 2.13 CPU, tfcompile formats v1), minus a 0.5 dB
margin. Measured values are written beside each bound. Sanity anchor: a
uniform b-bit quantizer gives ~6.02*b dB; E4M3 (3 mantissa bits) lands near
31.5 dB and the 4-bit formats near 17-21 dB, as for peers (torchao docs).
"""

import pytest
import torch

from tfcompile.kernels.formats import dequantize, quantize_fp8, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4

from fmt_oracles import heavy_tailed, sqnr_db

MARGIN_DB = 0.5
# (format, dist) -> measured SQNR in dB
MEASURED = {
    ("mxfp4-floor", "gauss"): 18.80, ("mxfp4-floor", "t3"): 17.01,
    ("mxfp4-ceil", "gauss"): 18.76, ("mxfp4-ceil", "t3"): 16.41,
    ("mxfp8-floor", "gauss"): 30.66, ("mxfp8-floor", "t3"): 29.65,
    ("mxfp8-ceil", "gauss"): 31.48, ("mxfp8-ceil", "t3"): 31.49,
    ("nvfp4", "gauss"): 20.43, ("nvfp4", "t3"): 20.81,
    ("fp8-tensor", "gauss"): 31.56, ("fp8-tensor", "t3"): 31.58,
    ("fp8-channel", "gauss"): 31.55, ("fp8-channel", "t3"): 31.88,
    ("fp8-block", "gauss"): 31.55, ("fp8-block", "t3"): 31.69,
}
QUANT = {
    "mxfp4-floor": lambda w: quantize_mxfp4(w, rule="floor"),
    "mxfp4-ceil": lambda w: quantize_mxfp4(w, rule="ceil"),
    "mxfp8-floor": lambda w: quantize_mxfp8(w, rule="floor"),
    "mxfp8-ceil": lambda w: quantize_mxfp8(w, rule="ceil"),
    "nvfp4": quantize_nvfp4,
    "fp8-tensor": lambda w: quantize_fp8(w, "tensor"),
    "fp8-channel": lambda w: quantize_fp8(w, "channel"),
    "fp8-block": lambda w: quantize_fp8(w, "block"),
}


def weights(dist: str) -> torch.Tensor:
    if dist == "gauss":
        return torch.randn(256, 4096, generator=torch.Generator().manual_seed(0)).bfloat16()
    return heavy_tailed((256, 4096), 3, seed=1).bfloat16()


@pytest.mark.parametrize("fmt,dist", sorted(MEASURED), ids=[f"{f}-{d}" for f, d in sorted(MEASURED)])
def test_sqnr_bound(fmt, dist):
    w = weights(dist)
    got = sqnr_db(w, dequantize(QUANT[fmt](w)))
    assert got >= MEASURED[(fmt, dist)] - MARGIN_DB, f"{fmt} on {dist}: {got:.2f} dB"


def test_default_rules_are_the_better_measured_ones():
    from tfcompile.kernels.formats import DEFAULT_MX_RULE, DEFAULT_MXFP8_RULE
    for fmt, default in (("mxfp4", DEFAULT_MX_RULE), ("mxfp8", DEFAULT_MXFP8_RULE)):
        other = "ceil" if default == "floor" else "floor"
        for dist in ("gauss", "t3"):
            assert MEASURED[(f"{fmt}-{default}", dist)] >= MEASURED[(f"{fmt}-{other}", dist)]
