"""weight_amax and fp8_weight_scale against plain torch (the spec: amax = max|w|, scale = amax/448)."""

from __future__ import annotations

import pytest
import torch

from tfcompile.errors import FormatError
from tfcompile.kernels.formats import fp8_weight_scale, quantize_fp8, weight_amax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_weight_amax_matches_torch(dtype, impl):
    w = (torch.randn(37, 96) * 3).to(dtype)
    w[5, 7] = -40.0
    assert torch.equal(weight_amax(w, impl=impl), torch.tensor([40.0]))
    assert weight_amax(torch.zeros(4, 32, dtype=dtype), impl=impl).item() == 0.0


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_weight_amax_names_nonfinite_tensor(impl):
    w = torch.randn(8, 64)
    w[3, 3] = float("nan")
    with pytest.raises(FormatError, match="layers.0.q_proj.weight"):
        weight_amax(w, name="layers.0.q_proj.weight", impl=impl)


@pytest.mark.parametrize("gran", ["tensor", "channel", "block"])
def test_fp8_weight_scale_is_what_quantize_fp8_uses(gran):
    w = torch.randn(200, 300).bfloat16()
    s = fp8_weight_scale(w, gran)
    assert torch.equal(s, quantize_fp8(w, gran).scale)
    if gran == "channel":  # spec: per output row, max|w| / 448
        assert torch.equal(s, w.float().abs().amax(1, keepdim=True) / 448)
