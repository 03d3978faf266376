"""Edge-case policy (docs/formats.md): each case has a defined, tested result."""

import warnings

import pytest
import torch

from tfcompile.errors import FormatError, UserError
from tfcompile.kernels.formats import (dequantize, quantize_fp8, quantize_fp8_act, quantize_mx_act,
                                       quantize_mxfp4, quantize_mxfp8, quantize_nvfp4, quantize_nvfp4_act)

from fmt_oracles import DTYPES

WEIGHT_Q = {
    "fp8": lambda w, **k: quantize_fp8(w, "block", **k),
    "mxfp8": quantize_mxfp8,
    "mxfp4": quantize_mxfp4,
    "nvfp4": quantize_nvfp4,
}
IMPLS = ("reference", "auto")


@pytest.mark.parametrize("fmt", WEIGHT_Q)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_is_an_error_naming_the_tensor(fmt, impl, bad):
    w = torch.randn(4, 64)
    w[2, 33] = bad
    with pytest.raises(FormatError) as e:
        WEIGHT_Q[fmt](w, name="model.layers.0.mlp.down_proj.weight", impl=impl)
    assert "'model.layers.0.mlp.down_proj.weight'" in e.value.message
    assert "NaN or Inf" in e.value.message and e.value.hint
    assert isinstance(e.value, UserError)


def test_nonfinite_with_given_scales():
    w = torch.randn(4, 64)
    w[0, 0] = float("nan")
    for impl in IMPLS:
        with pytest.raises(FormatError, match="'w'"):
            quantize_nvfp4(w, global_scale=torch.tensor([100.0]), name="w", impl=impl)
        with pytest.raises(FormatError, match="'w'"):
            quantize_fp8(w, scale=torch.tensor([1.0]), name="w", impl=impl)
    with pytest.raises(FormatError):
        quantize_fp8_act(w, "per_token")


@pytest.mark.parametrize("fmt,block", [("mxfp8", 32), ("mxfp4", 32), ("nvfp4", 16)])
def test_k_not_divisible(fmt, block):
    w = torch.randn(8, block * 3 + 8)
    with pytest.raises(FormatError) as e:
        WEIGHT_Q[fmt](w, name="lm_head.weight")
    assert "'lm_head.weight'" in e.value.message and str(block) in e.value.message
    assert "--ignore" in e.value.hint


@pytest.mark.parametrize("fmt", WEIGHT_Q)
@pytest.mark.parametrize("impl", IMPLS)
def test_all_zero_blocks_and_tensors(fmt, impl):
    w = torch.zeros(2, 128)
    q = WEIGHT_Q[fmt](w, impl=impl)
    s = q.scale.view(torch.uint8) if q.scale.element_size() == 1 else q.scale
    one = {"fp8": 1.0, "mxfp8": 127, "mxfp4": 127, "nvfp4": 0x38}[fmt]  # 1.0 in each scale type
    assert (s == one).all()
    if fmt == "nvfp4":
        assert q.global_scale.tolist() == [1.0]
    back = dequantize(q)
    assert back.isfinite().all() and (back == 0).all()


@pytest.mark.parametrize("fmt", WEIGHT_Q)
def test_input_dtypes_agree(fmt):
    """bf16/fp16/fp32 inputs holding the same values give the same QTensor."""
    w = torch.randn(16, 128).bfloat16()
    qs = [WEIGHT_Q[fmt](w.to(dt)) for dt in DTYPES]
    for q in qs[1:]:
        assert torch.equal(q.data.view(torch.uint8), qs[0].data.view(torch.uint8))
        assert torch.equal(q.scale.view(torch.uint8) if q.scale.element_size() == 1 else q.scale,
                           qs[0].scale.view(torch.uint8) if qs[0].scale.element_size() == 1 else qs[0].scale)


def test_rejects_other_dtypes_and_shapes():
    with pytest.raises(FormatError, match="dtype"):
        quantize_nvfp4(torch.zeros(4, 16, dtype=torch.float64), name="x")
    with pytest.raises(FormatError, match="dims"):
        quantize_mxfp4(torch.zeros(32), name="x")
    with pytest.raises(ValueError):
        quantize_mxfp4(torch.zeros(2, 32), rule="nearest")


def test_shapes_of_outputs():
    w = torch.randn(2, 48, 128)
    assert quantize_nvfp4(w).data.shape == (2, 48, 64) and quantize_nvfp4(w).scale.shape == (2, 48, 8)
    assert quantize_mxfp4(w).data.shape == (2, 48, 64) and quantize_mxfp4(w).scale.shape == (2, 48, 4)
    assert quantize_mxfp8(w).data.shape == w.shape and quantize_mxfp8(w).data.dtype == torch.float8_e4m3fn
    for q in (quantize_nvfp4(w), quantize_mxfp4(w), quantize_fp8(w, "channel")):
        assert dequantize(q, torch.bfloat16).shape == w.shape and dequantize(q, torch.bfloat16).dtype == torch.bfloat16


def test_activation_quantizers():
    x = torch.randn(3, 7, 64)
    for elem in ("fp4", "fp8"):
        q = quantize_mx_act(x, elem)
        assert dequantize(q).shape == x.shape
    q = quantize_nvfp4_act(x, torch.tensor([2688.0 / 4]))
    assert dequantize(q).shape == x.shape


def test_fallback_without_native(monkeypatch):
    """No compiler: impl='auto' still works (reference) after one warning."""
    from tfcompile.kernels.formats import _native
    monkeypatch.setattr(_native, "_state", {"isa": None})
    monkeypatch.setattr(_native, "_libs", {})
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("TFCOMPILE_CACHE", "/tmp/tfcompile-test-nocc")
    monkeypatch.setattr(_native, "cpu_tag", lambda: "no-such-cpu-for-test")
    with pytest.warns(RuntimeWarning, match="reference"):
        q = quantize_nvfp4(torch.randn(4, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        quantize_nvfp4(torch.randn(4, 32))
    assert q.data.shape == (4, 16)
    with pytest.raises(RuntimeError):
        quantize_nvfp4(torch.randn(4, 32), impl="fast")
