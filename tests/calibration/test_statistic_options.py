"""A statistic's options are the calibrate fields named `{statistic}_{option}` (passes/calibrate.py
`_statistics`), handed to its recorder through `Setup.options`; the calibrate pass names none.

Checked end to end on calibrate.hessian_dtype (the "hessian" statistic's option `dtype`): with the
forwards in bf16, "compute" must give a Hessian computed in bf16 (differing from the float32 one
by bf16 roundings only), "float32" the float32 one, in both loops.
"""

from __future__ import annotations

import pytest
import torch

import tfcompile.api  # noqa: F401  (registers the passes and the algorithms)
from tfcompile.calibration.record import CALIB as CALIB_FACT
from tfcompile.calibration.hessian import hessians
from tfcompile.passes.calibrate import CalibrateConfig, requested


def _hessians(src, tmp_path, mode: str, hessian_dtype: str) -> dict:
    from tfcompile.api import quantize

    calib = {"data": "random", "samples": 2, "seq_len": 16, "mode": mode, "dtype": "bfloat16",
             "hessian_dtype": hessian_dtype}
    # cut after calibrate: 32 tokens give a bf16 Hessian of rank < K that GPTQ would refuse to solve
    ctx = quantize(src, tmp_path / f"{mode}-{hessian_dtype}", "nvfp4a16", until="calibrate",
                   overrides={"quantize": {"algorithm": "gptq"}, "calibrate": calib})
    assert ctx.pass_stats["calibrate"]["loop"] == mode
    h = hessians(ctx[CALIB_FACT])
    return {k: h[k] for k in h}


@pytest.mark.parametrize("mode", ["whole", "sequential"])
def test_hessian_dtype_reaches_the_recorder(tiny_llama_src, tmp_path, mode):
    exact = _hessians(tiny_llama_src, tmp_path, mode, "float32")
    rounded = _hessians(tiny_llama_src, tmp_path, mode, "compute")
    assert exact.keys() == rounded.keys() and len(exact) == 8
    assert all(h.dtype == torch.float32 for h in rounded.values())  # the solve gets float32 either way
    assert any(not torch.equal(exact[k], rounded[k]) for k in exact)  # the option changed the statistic ...
    for k, h in exact.items():  # ... by bf16 roundings of the products and sums (a few ulps of 2^-8)
        assert torch.allclose(rounded[k], h, rtol=2 ** -5, atol=2 ** -5 * float(h.abs().max())), k


def test_requested_statistics_come_from_the_registration_and_the_switches():
    assert requested(CalibrateConfig()) == []
    assert requested(CalibrateConfig(hessian=True)) == ["hessian"]
    assert requested(CalibrateConfig(awq=True, statistics=("hessian",))) == ["awq", "hessian"]
    from tfcompile.errors import RecipeError

    with pytest.raises(RecipeError, match="'nope' is not a registered statistic") as e:
        requested(CalibrateConfig(statistics=("nope",)))
    assert "hessian" in e.value.hint
