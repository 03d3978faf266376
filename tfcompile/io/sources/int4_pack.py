"""compressed-tensors `pack-quantized` INT4 weights, as Kimi K2-Thinking and Kimi K2.5 publish their
routed experts (INT4 weight-only, symmetric, groups of 32 along K; attention, shared experts, dense
MLPs and lm_head stay bf16 through `ignore`). Per Linear `m`:
- `m.weight_packed` int32 [N, ceil(K/8)]: code k of a row in bits 4*(k % 8) .. 4*(k % 8)+3 of word k // 8
  (little-endian words), stored offset-binary (q + 8, q in [-8, 7]): compressed-tensors `pack_to_int32`;
- `m.weight_scale` bf16/fp16/fp32 [N, K/group]; `m.weight_shape` int32 [2] = [N, K].
Decoded as compressed-tensors' decompressor does: q * scale, in float32, rounded once to bf16
(tests/families/test_sources.py checks it against compressed-tensors' own PackedQuantizationCompressor).
Other bit widths and asymmetric groups (`weight_zero_point`) are refused, never misread.
"""

from __future__ import annotations

import sys

import torch

from tfcompile.errors import CheckpointError
from tfcompile.io.sources.scales import FLOAT_CODES, cdiv, check_header, check_values

_HINT = "tfcompile reads INT4 symmetric pack-quantized weights (Kimi K2-Thinking / K2.5); dequantize others to bf16 first"


def check_int4_config(ckpt, qc: dict) -> None:
    """Every config group's weights are 4-bit symmetric integers (what this decoder reads)."""
    for name, group in (qc.get("config_groups") or {}).items():
        w = (group or {}).get("weights") or {}
        if w.get("type") != "int" or w.get("num_bits") != 4 or w.get("symmetric") is False:
            raise CheckpointError(f"{ckpt.path}/config.json: quantization_config config_groups.{name}.weights is "
                                  f"{w.get('type')} {w.get('num_bits')}-bit (symmetric {w.get('symmetric')}) in a "
                                  f"pack-quantized checkpoint", hint=_HINT)


def int4_shape(ckpt, names: set[str], m: str) -> tuple[int, int]:
    """[N, K] of Linear `m` from `weight_shape`, after checking the packed and scale headers agree."""
    data, scale, shape = f"{m}.weight_packed", f"{m}.weight_scale", f"{m}.weight_shape"
    if f"{m}.weight_zero_point" in names:
        raise CheckpointError(f"{ckpt.path}: {m}.weight_zero_point: asymmetric INT4 groups", hint=_HINT)
    if shape not in names:
        raise CheckpointError(f"{ckpt.path}: {shape} is missing beside {data}",
                              hint="the checkpoint is incomplete; re-download it")
    n, k = (int(v) for v in ckpt.get(shape).reshape(-1).tolist())
    check_header(ckpt, data, shape, {"I32"}, [(n, cdiv(k, 8))])
    cols = ckpt.info(scale).shape[-1] if len(ckpt.info(scale).shape) == 2 else 0
    if cols < 1 or cdiv(k, cdiv(k, cols)) != cols:
        raise CheckpointError(f"{ckpt.path}: {scale} {list(ckpt.info(scale).shape)} is no group grid of {m} "
                              f"[{n}, {k}]", hint=_HINT)
    check_header(ckpt, scale, data, FLOAT_CODES, [(n, cols)])
    return n, k


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [N, ceil(K/8)] -> int8 codes [N, K] in [-8, 7]."""
    if sys.byteorder != "little":  # the words' bytes are read in memory order
        raise RuntimeError("INT4 pack-quantized decoding assumes a little-endian host")
    b = packed.contiguous().view(torch.uint8)  # [N, 4 * words]: byte j holds codes 2j (low) and 2j+1 (high)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(packed.shape[0], -1)[:, :k]
    return codes.to(torch.int8) - 8


def int4_decoder(ckpt, m: str, shape: tuple[int, int]):
    n, k = shape

    def decode() -> torch.Tensor:
        scale = check_values(ckpt.path, f"{m}.weight_scale", ckpt.get(f"{m}.weight_scale"), per_block=True)
        group = cdiv(k, scale.shape[-1])
        s = scale.float().repeat_interleave(group, dim=-1)[:, :k]  # [N, K]
        return (unpack_int4(ckpt.get(f"{m}.weight_packed"), k).float() * s).to(torch.bfloat16)

    return decode
