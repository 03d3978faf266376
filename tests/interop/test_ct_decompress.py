"""compressed-tensors' own decompressors reproduce tfcompile's dequantized weights bit for bit.

For every quantized Linear of the artifact, its stored tensors (local names:
weight_packed / weight / weight_scale / weight_global_scale) go through the
compressor class that compressed-tensors' registry maps the artifact's
`format` to, with the QuantizationScheme parsed from the artifact's own
config.json. That is exactly what vLLM's and transformers' loaders do. The
result must equal `tfcompile.kernels.formats.dequantize` of the same tensors,
computed in fp32 and rounded once to the compressor's output dtype (bf16).
A second, fp32 check uses compressed-tensors' lower-level functions
(unpack_fp4_from_uint8, decompress_mx_scale, lifecycle.forward.dequantize)
with an fp32 output, so no bf16 rounding can hide a difference.
"""

from __future__ import annotations

import pytest
import torch

from interop_util import FORMATS, qtensor_of, quant_config, quantized_modules, read_tensors

from compressed_tensors.compressors import (BaseCompressor, FloatQuantizationCompressor,
                                            MXFP4PackedCompressor, MXFP8QuantizationCompressor,
                                            NVFP4PackedCompressor)
from compressed_tensors.quantization import QuantizationConfig

EXPECTED_CLASS = {
    "nvfp4": NVFP4PackedCompressor, "nvfp4a16": NVFP4PackedCompressor,
    "mxfp4": MXFP4PackedCompressor, "mxfp4a16": MXFP4PackedCompressor,
    "mxfp8": MXFP8QuantizationCompressor,
    "fp8": FloatQuantizationCompressor, "fp8-dynamic": FloatQuantizationCompressor,
    "fp8-block": FloatQuantizationCompressor,
}
FP8_STRATEGY = {"fp8": ("tensor", (1,)), "fp8-dynamic": ("channel", None), "fp8-block": ("block", None)}


def _scheme(artifact):
    qc = QuantizationConfig.model_validate(quant_config(artifact))
    assert list(qc.config_groups) == ["group_0"]
    return qc, qc.config_groups["group_0"]


def _local(tensors, module):
    p = module + "."
    return {k[len(p):]: v for k, v in tensors.items() if k.startswith(p) and "." not in k[len(p):]}


@pytest.mark.parametrize("fmt", FORMATS)
def test_compressor_decompress_equals_our_dequantize(fmt, llama_artifact):
    art = llama_artifact(fmt)
    qc, scheme = _scheme(art)
    comp = BaseCompressor.get_value_from_registry(qc.format)
    assert comp is EXPECTED_CLASS[fmt], (qc.format, comp)
    tensors = read_tensors(art)
    mods = quantized_modules(tensors)
    assert len(mods) == 14  # 2 layers x (q, k, v, o, gate, up, down)
    from tfcompile.kernels.formats import dequantize

    for m in mods:
        out = comp.decompress(_local(tensors, m), scheme)["weight"]
        ours = dequantize(qtensor_of(tensors, m), torch.float32).to(out.dtype)
        assert out.shape == ours.shape, m
        a, b = out.float(), ours.float()
        assert torch.equal(a, b), (m, int((a != b).sum()), (a - b).abs().max().item())
        # not vacuous: the weight is not all zeros and uses many distinct values
        assert a.abs().sum() > 0 and a.unique().numel() > 8


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"])
def test_fp32_decode_equals_our_dequantize(fmt, llama_artifact):
    """The same comparison in fp32 through compressed-tensors' lower-level functions."""
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    from tfcompile.kernels.formats import dequantize

    art = llama_artifact(fmt)
    _, scheme = _scheme(art)
    tensors = read_tensors(art)
    if fmt in FP8_STRATEGY:
        assert scheme.weights.strategy == FP8_STRATEGY[fmt][0]
    mods = quantized_modules(tensors)
    assert len(mods) == 14  # 2 layers x (q, k, v, o, gate, up, down): the loop below checks each
    for m in mods:
        t = _local(tensors, m)
        if "weight_packed" in t:
            n, half = t["weight_packed"].shape
            x = unpack_fp4_from_uint8(t["weight_packed"], n, 2 * half, dtype=torch.float32)
        else:
            x = t["weight"].float()
        scale = t["weight_scale"]
        scale = decompress_mx_scale(scale).float() if scale.dtype == torch.uint8 else scale.float()
        gs = t.get("weight_global_scale")
        theirs = ct_dequantize(x_q=x, scale=scale, args=scheme.weights, dtype=torch.float32,
                               global_scale=gs)
        ours = dequantize(qtensor_of(tensors, m), torch.float32)
        assert torch.equal(theirs, ours), (m, (theirs - ours).abs().max().item())


def test_scale_shapes_follow_compressed_tensors(llama_artifact):
    """FP8 scale shapes are what compressed-tensors initializes for each strategy."""
    t = read_tensors(llama_artifact("fp8"))
    assert tuple(t["model.layers.0.mlp.down_proj.weight_scale"].shape) == (1,)
    assert tuple(t["model.layers.0.mlp.down_proj.input_scale"].shape) == (1,)
    t = read_tensors(llama_artifact("fp8-dynamic"))
    assert tuple(t["model.layers.0.mlp.down_proj.weight_scale"].shape) == (128, 1)
    t = read_tensors(llama_artifact("fp8-block"))
    assert tuple(t["model.layers.0.mlp.down_proj.weight_scale"].shape) == (1, 2)
