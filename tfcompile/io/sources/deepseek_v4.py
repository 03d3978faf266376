"""DeepSeek-V4 as published: FP8 E4M3 Linears with E8M0 (UE8M0) block scales, FP4 routed experts.

config.json: `quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
"dynamic", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}` and `expert_dtype: "fp4"`
(transformers 5.25 `DeepseekV4Config.__post_init__` folds a top-level `expert_dtype` into the
quantization_config; `FineGrainedFP8Config` checks both). Each quantized Linear stores `X.weight` and
its scale as `X.scale` (transformers' FP8 quantizer renames `^(.+)\\.scale` -> `weight_scale_inv`;
`X.weight_scale_inv` is read too):
- a dense Linear: `weight` float8_e4m3fn [N, K], `scale` float8_e8m0fnu (or uint8) [ceil(N/128),
  ceil(K/128)]: one power of two 2^(b - 127) per 128x128 block, a dequant multiplier;
- a routed expert (`ffn.experts.E.w1/w2/w3`) with expert_dtype fp4: `weight` int8 [N, K/2], two E2M1
  codes per byte, low nibble first (code: sign bit 3, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6), and
  `scale` E8M0 [N, K/32]: MXFP4's layout (transformers `Fp8Dequantize._unpack_fp4`, `_FP4_E2M1_LUT`).
Decoded as the element times its scale in fp32, rounded once to bf16 (transformers'
`Fp8Dequantize._dequantize_one`, the oracle of tests/families/test_deepseek_v4.py). Router, norms,
hyper-connection parameters, `attn_sink`, the hash router's `tid2eid` pass through.
"""

from __future__ import annotations

import torch

from tfcompile.errors import CheckpointError
from tfcompile.io.sources.base import DequantizedSource
from tfcompile.io.sources.scales import cdiv, check_header, check_values
from tfcompile.kernels.formats import dequantize, weight_quantizer

SCALE_SUFFIXES = (".scale", ".weight_scale_inv")
E8M0_CODES = {"F8_E8M0", "U8"}
_HINT = "tfcompile reads DeepSeek-V4's FP8 (E8M0 128x128 block scales) and FP4 (E8M0 per 32) weights"


def is_v4(qc: dict) -> bool:
    """A quantization_config of DeepSeek-V4's kind (power-of-two scales, optionally FP4 experts)."""
    return qc.get("scale_fmt") == "ue8m0" or qc.get("expert_dtype") == "fp4"


def open_deepseek_v4(ckpt, qc: dict, block: tuple[int, int]) -> DequantizedSource:
    # expert_dtype (fp8 or fp4 in transformers' FineGrainedFP8Config) is not trusted: each weight's own dtype
    # (F8_E4M3 or packed I8) decides how it is decoded, and its scale is checked against it
    if qc.get("scale_fmt", "ue8m0") != "ue8m0":
        raise CheckpointError(f"{ckpt.path}/config.json: scale_fmt {qc.get('scale_fmt')!r} beside expert_dtype "
                              f"{qc.get('expert_dtype')!r} is not a DeepSeek-V4 layout tfcompile reads", hint=_HINT)
    names = set(ckpt.names())
    decoders, hidden, kinds = {}, set(), {"e4m3": 0, "e2m1": 0}
    for scale in sorted(n for n in names if n.endswith(SCALE_SUFFIXES)):
        w = scale[: scale.rindex(".")] + ".weight"
        if w not in names:
            continue  # a parameter that is only named like a scale
        kind, shape = _kind(ckpt, w, scale, block)
        decoders[w] = (shape, w, _decoder(ckpt, w, scale, shape, kind, block))
        hidden.add(scale)
        kinds[kind] += 1
    return DequantizedSource(ckpt, decoders, hidden, {"format": "deepseek-v4", "quant_method": "fp8",
                                                      "weight_block_size": list(block), "scale_fmt": "ue8m0",
                                                      "expert_dtype": qc.get("expert_dtype"),
                                                      "dequantized_tensors": len(decoders),
                                                      "fp8_tensors": kinds["e4m3"], "fp4_tensors": kinds["e2m1"]})


def _kind(ckpt, w: str, scale: str, block: tuple[int, int]) -> tuple[str, tuple[int, int]]:
    """(element "e4m3" | "e2m1", the bf16 weight's [N, K]) from the headers; the scale's dtype and shape checked."""
    info = ckpt.info(w)
    if len(info.shape) != 2 or info.dtype not in ("F8_E4M3", "I8", "U8"):
        raise CheckpointError(f"{ckpt.path}: {w} is {info.dtype} {list(info.shape)} beside {scale}; expected a 2-D "
                              f"F8_E4M3 weight, or I8 packed FP4 pairs", hint=_HINT)
    n, k = info.shape
    if info.dtype == "F8_E4M3":
        check_header(ckpt, scale, w, E8M0_CODES, [(cdiv(n, block[0]), cdiv(k, block[1]))])
        return "e4m3", (n, k)
    check_header(ckpt, scale, w, E8M0_CODES, [(n, 2 * k // 32)] if (2 * k) % 32 == 0 else [])
    return "e2m1", (n, 2 * k)


def _e8m0_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _decoder(ckpt, w: str, s: str, shape: tuple[int, int], kind: str, block: tuple[int, int]):
    def decode() -> torch.Tensor:
        scale = check_values(ckpt.path, s, _e8m0_bytes(ckpt.get(s)), per_block=True)
        if kind == "e2m1":  # MXFP4's layout: packed pairs (low nibble first) + E8M0 per 32 along K
            q = weight_quantizer("mxfp4").from_stored(ckpt.get(w).view(torch.uint8), scale, None, shape)
        else:  # FP8 blocks with power-of-two multipliers 2^(b - 127)
            mult = torch.exp2(scale.float() - 127.0)
            q = weight_quantizer("fp8", "block", block).from_stored(ckpt.get(w), mult, None, shape)
        return dequantize(q, torch.bfloat16)

    return decode
