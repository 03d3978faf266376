"""compressed-tensors checkpoints (tfcompile's own artifacts, llm-compressor's) as a source.

Re-quantization, e.g. an FP8 model to NVFP4: every quantized Linear reads as its bf16
`X.weight`, decoded from what compressed-tensors stores (docs/formats.md):
- NVFP4: `weight_packed` u8 [N, K/2], `weight_scale` e4m3 [N, K/16], `weight_global_scale` f32 (1,);
- MXFP4: `weight_packed` u8 [N, K/2], `weight_scale` u8 E8M0 [N, K/32];
- MXFP8: `weight` e4m3 [N, K], `weight_scale` u8 E8M0 [N, K/32];
- FP8:   `weight` e4m3 [N, K], `weight_scale` (1,) per tensor, (N, 1) per channel, or
         [ceil(N/128), ceil(K/128)] per block, in the model dtype;
- INT4 (`pack-quantized`, Kimi K2-Thinking / K2.5 experts): `weight_packed` int32 [N, K/8],
         `weight_scale` [N, K/32], `weight_shape` [2] (int4_pack.py).
Activation and KV-cache scales (`input_scale`, `input_global_scale`, `k_scale`, `v_scale`)
are hidden: the new run computes its own. The decoded values are exactly what
compressed-tensors' decompressors give (tests/interop/test_ct_decompress.py proves it
for every format), rounded once to bf16.
"""

from __future__ import annotations

import torch

from tfcompile.errors import CheckpointError
from tfcompile.io.sources.base import DequantizedSource
from tfcompile.io.sources.int4_pack import check_int4_config, int4_decoder, int4_shape
from tfcompile.io.sources.scales import FLOAT_CODES, cdiv, check_header, check_values
from tfcompile.kernels.formats import QTensor, dequantize, quantizer_from_stored

HIDE = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale", ".weight_zero_point", ".weight_shape")


def open_compressed(ckpt, qc: dict) -> DequantizedSource:
    names = set(ckpt.names())
    decoders, hidden = {}, {n for n in names if n.endswith(HIDE)}
    for scale in sorted(n for n in names if n.endswith(".weight_scale")):
        m = scale[: -len(".weight_scale")]
        parts = [f"{m}.{s}" for s in ("weight_packed", "weight", "weight_scale", "weight_global_scale")
                 if f"{m}.{s}" in names]
        data = f"{m}.weight_packed" if f"{m}.weight_packed" in names else f"{m}.weight"
        if data in names and ckpt.info(data).dtype == "I32":  # pack-quantized INT4 (Kimi K2-Thinking / K2.5)
            check_int4_config(ckpt, qc)
            shape = int4_shape(ckpt, names, m)
            decoders[f"{m}.weight"] = (shape, data, int4_decoder(ckpt, m, shape))
        else:
            n_rows, k = _checked_shape(ckpt, names, m, data)
            decoders[f"{m}.weight"] = ((n_rows, k), data, _decoder(ckpt, m, (n_rows, k)))
        hidden |= set(parts)
    return DequantizedSource(ckpt, decoders, hidden, {"format": "compressed-tensors",
                                                      "quant_method": "compressed-tensors",
                                                      "compression": qc.get("format"),
                                                      "dequantized_tensors": len(decoders)})


def _checked_shape(ckpt, names: set[str], m: str, data: str) -> tuple[int, int]:
    """The [N, K] of Linear `m`, after checking its data and scale tensors' headers agree with it
    (tfcompile/io/sources/scales.py); CheckpointError naming the tensor otherwise."""
    info, packed, scale = ckpt.info(data), data.endswith("_packed"), f"{m}.weight_scale"
    if data not in names or len(info.shape) != 2 or min(info.shape) < 1 or \
            info.dtype != ("U8" if packed else "F8_E4M3"):
        raise CheckpointError(f"{ckpt.path}: {data} is {info.dtype} {list(info.shape)} beside {scale}; expected a "
                              f"2-D {'U8 (packed E2M1 pairs)' if packed else 'F8_E4M3'} weight",
                              hint="the checkpoint is not a compressed-tensors format tfcompile reads")
    n, k = info.shape[0], info.shape[1] * (2 if packed else 1)
    code = ckpt.info(scale).dtype
    if packed and code == "F8_E4M3":  # NVFP4: E4M3 per 16, and one fp32 global scale
        check_header(ckpt, scale, data, {"F8_E4M3"}, [(n, cdiv(k, 16))])
        check_header(ckpt, f"{m}.weight_global_scale", data, {"F32"}, [(1,), ()]) \
            if f"{m}.weight_global_scale" in names else _missing(ckpt, f"{m}.weight_global_scale")
    elif code == "U8":  # MXFP4 / MXFP8: E8M0 per 32
        check_header(ckpt, scale, data, {"U8"}, [(n, cdiv(k, 32))])
    else:  # FP8 (packed with another scale dtype fails here too)
        check_header(ckpt, scale, data, set() if packed else FLOAT_CODES, [(1,), (), (n, 1), *_grid(ckpt, scale, n, k)])
    return n, k


def _grid(ckpt, scale: str, n: int, k: int) -> list[tuple[int, int]]:
    """The scale's own shape when it is a block grid of [N, K] (each side ceil(dim / block))."""
    shape = tuple(ckpt.info(scale).shape)
    if len(shape) == 2 and 0 < shape[0] <= n and 0 < shape[1] <= k and \
            cdiv(n, cdiv(n, shape[0])) == shape[0] and cdiv(k, cdiv(k, shape[1])) == shape[1]:
        return [shape]
    return []


def _missing(ckpt, name: str) -> None:
    raise CheckpointError(f"{ckpt.path}: {name} is missing (an NVFP4 weight needs its global scale)",
                          hint="the checkpoint is incomplete; re-download it")


def qtensor_from(get, names, m: str, shape: tuple[int, int]) -> QTensor:
    """The QTensor of Linear `m` from its compressed-tensors tensors (`get(name)`): the weight
    quantizer that stored them (kernels/formats `quantizer_from_stored`) reads them back (`from_stored`)."""
    packed = f"{m}.weight_packed" in names
    data, scale = get(f"{m}.weight_packed" if packed else f"{m}.weight"), get(f"{m}.weight_scale")
    wq = quantizer_from_stored(packed, scale, shape)
    gscale = get(f"{m}.weight_global_scale") if wq.shares_global_scale else None
    return wq.from_stored(data, scale, gscale, shape)


def _decoder(ckpt, m: str, shape: tuple[int, int]):
    names = set(ckpt.names())

    def get(name: str) -> torch.Tensor:  # scales' values checked as they are read
        t = ckpt.get(name)
        if name == f"{m}.weight_global_scale":
            return check_values(ckpt.path, name, t, per_block=False)
        if name.endswith(".weight_scale"):
            return check_values(ckpt.path, name, t, per_block=t.numel() > 1 and tuple(t.shape) != (shape[0], 1))
        return t

    def decode() -> torch.Tensor:
        return dequantize(qtensor_from(get, names, m, shape), torch.bfloat16)

    return decode
