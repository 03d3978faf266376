"""calibrate.hessian_dtype and calibrate.hessian_blocks: X^T X computed and summed in float32 (default)
or the forwards' dtype, whole or only its diagonal blocks.

Oracle: the definition written out by hand per batch (float64 for the float32 path; for the bf16
path, every batch's product rounded to bf16 and the running sum rounded to bf16 after each add,
the rounding the option promises), against what `HessianRecorder` records through real forward
hooks on a Linear; and the recipe records the field only when it is set.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tfcompile.calibration.hessian import HessianRecorder
from tfcompile.calibration.statistics import local_setup
from tfcompile.errors import RecipeError
from tfcompile.passes.calibrate import CalibrateConfig
from tfcompile.recipe import PassEntry, Recipe


def _record(dtype: torch.dtype, batches: list[torch.Tensor], blocks: int = 0) -> torch.Tensor:
    model = nn.Sequential(nn.Linear(48, 8, bias=False)).to(torch.bfloat16)
    option = "float32" if dtype == torch.float32 else "compute"  # calibrate.hessian_dtype, forwards in `dtype`
    rec = HessianRecorder(local_setup(model, {"0": "g"}, {"dtype": option, "blocks": blocks}, compute_dtype=dtype))
    with torch.inference_mode():
        for x in batches:
            model(x)
    for h in rec.hooks:
        h.remove()
    return rec.result()["g"]


def _batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    # [5, 7, 48] bf16 activations with a few large channels (as real ones have), 3 batches
    scale = torch.ones(48)
    scale[:3] = 40.0
    return [(torch.randn(5, 7, 48, generator=gen) * scale).to(torch.bfloat16) for _ in range(3)]


def test_float32_is_the_exact_mean_of_x_transpose_x():
    xs = _batches()
    h = _record(torch.float32, xs)
    rows = torch.cat([x.reshape(-1, 48).double() for x in xs])
    ref = rows.T @ rows / rows.shape[0]
    assert h.dtype == torch.float32
    assert torch.allclose(h.double(), ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))


def test_compute_dtype_rounds_each_product_and_the_running_sum():
    xs = _batches()
    h = _record(torch.bfloat16, xs)
    acc = None
    for x in xs:  # the promised rounding, written out: bf16 product, bf16 sum
        p = (x.reshape(-1, 48).double().T @ x.reshape(-1, 48).double()).to(torch.bfloat16)
        acc = p if acc is None else (acc.double() + p.double()).to(torch.bfloat16)
    ref = acc.float() / sum(x.shape[0] * x.shape[1] for x in xs)
    assert h.dtype == torch.float32  # the solve gets float32 either way
    # torch's bf16 matmul sums in float32 and rounds once: equal to the float64 product rounded,
    # but for a last-bit tie: at most one bf16 ulp (2^-7 relative) apart
    assert torch.allclose(h, ref, rtol=2 ** -7, atol=0)
    exact = _record(torch.float32, xs)
    assert not torch.equal(h, exact)  # the option changes the Hessian ...
    assert torch.allclose(h, exact, rtol=2 ** -6, atol=2 ** -6 * float(exact.abs().max()))  # ... by bf16 roundings


@pytest.mark.parametrize("blocks", [16, 8])
def test_diagonal_blocks_are_those_of_the_whole_mean(blocks):
    """Option blocks=b (calibrate.hessian_blocks): [K / b, b, b], each the b x b diagonal block of X^T X / n
    (float64 oracle)."""
    xs = _batches()
    hb = _record(torch.float32, xs, blocks)
    rows = torch.cat([x.reshape(-1, 48).double() for x in xs])
    ref = rows.T @ rows / rows.shape[0]
    assert hb.shape == (48 // blocks, blocks, blocks) and hb.dtype == torch.float32
    for i in range(48 // blocks):
        blk = ref[i * blocks:(i + 1) * blocks, i * blocks:(i + 1) * blocks]
        assert torch.allclose(hb[i].double(), blk, rtol=1e-6, atol=1e-6 * float(ref.abs().max())), i


def test_config_refuses_an_unknown_dtype_and_records_only_when_set():
    with pytest.raises(RecipeError, match="calibrate.hessian_dtype 'bf16'") as e:
        CalibrateConfig(hessian_dtype="bf16")
    assert e.value.hint and "compute" in e.value.hint

    def recorded(cfg: CalibrateConfig) -> dict:
        recipe = Recipe(version=1, format="nvfp4", passes=(PassEntry("calibrate", cfg),))
        return recipe.to_dict()["passes"][0]["config"]

    assert not {"hessian_dtype", "hessian_blocks"} & set(recorded(CalibrateConfig()))  # old artifacts' bytes
    assert recorded(CalibrateConfig(hessian_dtype="compute"))["hessian_dtype"] == "compute"
    assert recorded(CalibrateConfig(hessian_blocks=16))["hessian_blocks"] == 16
    with pytest.raises(RecipeError, match="hessian_blocks -1 is negative"):
        CalibrateConfig(hessian_blocks=-1)


def test_gptq_refuses_an_indefinite_hessian_with_a_hint():
    """A Hessian the damping cannot make positive definite (here one negative eigenvalue, as bf16
    rounding of a rank-deficient H can give) is a user error naming the fix, not a LinAlgError."""
    from tfcompile.kernels import formats as F
    from tfcompile.passes.quantize.gptq import NotPositiveDefinite, gptq_values

    k = 32
    h = torch.eye(k)
    h[5, 5] = -1.0  # mean(diag) = 30/32: damping 0.01 adds ~0.009, not enough
    w = torch.randn(4, k)
    grid = F.weight_quantizer("mxfp8")
    with pytest.raises(NotPositiveDefinite, match="not positive definite") as e:
        gptq_values(w, h, torch.ones(4, k), grid, damp=0.01)
    assert "quantize.gptq_damp" in e.value.hint
    assert gptq_values(w, h.abs(), torch.ones(4, k), grid, damp=0.01).shape == (4, k)  # made definite: solves
