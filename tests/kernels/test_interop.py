"""Against compressed-tensors 0.20: fp4 pack/unpack, NVFP4 compress and the
NVFP4/MXFP4 decompressors (the code vLLM/transformers load checkpoints with)."""

import pytest
import torch
from compressed_tensors.compressors import MXFP4PackedCompressor, NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.quant_scheme import MXFP4A16, NVFP4A16
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

from tfcompile.kernels.formats import (E2M1_VALUES, decode_e2m1, dequantize, pack_fp4, quantize_mxfp4,
                                       quantize_nvfp4, unpack_fp4)

from fmt_oracles import DTYPES, heavy_tailed

NV = QuantizationScheme(targets=["Linear"], **NVFP4A16)
MX = QuantizationScheme(targets=["Linear"], **MXFP4A16)


def test_pack_matches_compressed_tensors_all_256_pairs():
    a, b = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    codes = torch.stack([a.reshape(-1), b.reshape(-1)], 1).to(torch.uint8)  # [256, 2]: every byte
    vals = decode_e2m1(codes)
    vals = torch.where(codes == 8, torch.zeros_like(vals), vals)  # c-t packs +0 for the value 0
    ours = pack_fp4(torch.where(codes == 8, torch.zeros_like(codes), codes))
    assert torch.equal(ours, pack_fp4_to_uint8(vals))
    # spec (docs/formats.md "Packing and layout"): byte = q[2j] | q[2j+1] << 4
    assert ours[:, 0].tolist() == [int(c0) | (int(c1) << 4) for c0, c1 in torch.where(codes == 8, 0, codes).tolist()]


def test_unpack_matches_compressed_tensors_all_256_bytes():
    packed = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    theirs = unpack_fp4_from_uint8(packed, 16, 32, dtype=torch.float32)
    assert torch.equal(decode_e2m1(unpack_fp4(packed)), theirs)
    assert torch.equal(pack_fp4(unpack_fp4(packed)), packed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dist", ["gauss", "student_t"])
def test_nvfp4_decompressor_equals_dequantize(dtype, dist):
    w = (torch.randn(96, 512) if dist == "gauss" else heavy_tailed((96, 512))).to(dtype)
    w[3, :16] = 0  # an all-zero block
    q = quantize_nvfp4(w)
    out = NVFP4PackedCompressor.decompress(
        {"weight_packed": q.data, "weight_scale": q.scale, "weight_global_scale": q.global_scale}, NV)
    assert torch.equal(out["weight"], dequantize(q, torch.bfloat16))


@pytest.mark.parametrize("rule", ["floor", "ceil"])
@pytest.mark.parametrize("dist", ["gauss", "student_t"])
def test_mxfp4_decompressor_equals_dequantize(rule, dist):
    w = (torch.randn(64, 1024) if dist == "gauss" else heavy_tailed((64, 1024)) * 1e-3).bfloat16()
    q = quantize_mxfp4(w, rule=rule)
    out = MXFP4PackedCompressor.decompress({"weight_packed": q.data, "weight_scale": q.scale}, MX)
    assert torch.equal(out["weight"], dequantize(q, torch.bfloat16))


@pytest.mark.parametrize("dist", ["gauss", "student_t"])
def test_nvfp4_compress_equals_compressed_tensors(dist):
    """Same global scale, block scales and packed bytes as c-t's own compressor."""
    w = torch.randn(64, 256) if dist == "gauss" else heavy_tailed((64, 256), seed=3)
    g = generate_gparam(w.min(), w.max())
    blocks = w.view(64, 16, 16)
    s, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), NV.weights, global_scale=g)
    comp = NVFP4PackedCompressor.compress({"weight": w, "weight_scale": s, "weight_global_scale": g}, NV)
    q = quantize_nvfp4(w)
    assert torch.equal(q.global_scale, g)
    assert torch.equal(q.scale.view(torch.uint8), comp["weight_scale"].view(torch.uint8))
    assert torch.equal(q.data, comp["weight_packed"])


def test_e2m1_table_matches_compressed_tensors():
    from compressed_tensors.compressors.nvfp4.helpers import kE2M1ToFloat
    assert torch.equal(E2M1_VALUES[:8], kE2M1ToFloat.float()[:8])
