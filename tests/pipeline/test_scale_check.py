"""The scale check that gates every computed scale (pack) and every artifact (verify).

Oracle: torch's own decoding of each byte (float8_e4m3fn -> float32, and
E8M0 = 2^(e-127) with 0xFF = NaN per the OCP MX spec v1.0 section 5.4.1): a
scale is valid iff it decodes to a finite, strictly positive number. Every
one of the 256 codes is checked, alone and inside a large valid tensor.
"""

from __future__ import annotations

import math

import pytest
import torch

from tfcompile.artifact.verify import _bad_scale


def _e4m3_valid(code: int) -> bool:
    v = torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
    return math.isfinite(v) and v > 0


@pytest.mark.parametrize("code", range(256))
def test_e4m3_every_code(code):
    background = torch.full((4097,), 0x38, dtype=torch.uint8)  # 1.0
    background[1234] = code
    t = background.view(torch.float8_e4m3fn)
    why = _bad_scale(t)
    assert (why is None) == _e4m3_valid(code), (hex(code), why)
    if why is not None:
        v = t[1234].float().item()
        assert why == ("not finite" if math.isnan(v) else "zero or negative")


@pytest.mark.parametrize("code", range(256))
def test_e8m0_every_code(code):
    t = torch.full((999,), 127, dtype=torch.uint8)
    t[-1] = code
    assert (_bad_scale(t) is None) == (code != 0xFF)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad,why", [(float("nan"), "not finite"), (float("inf"), "not finite"),
                                     (float("-inf"), "not finite"), (0.0, "zero or negative"),
                                     (-0.0, "zero or negative"), (-1e-3, "zero or negative")])
def test_float_scales(dtype, bad, why):
    t = torch.rand(300, dtype=torch.float32).add_(0.01).to(dtype)
    assert _bad_scale(t) is None
    t[17] = bad
    assert _bad_scale(t) == why


def test_empty_scale_is_valid():
    assert _bad_scale(torch.empty(0, dtype=torch.float8_e4m3fn)) is None
