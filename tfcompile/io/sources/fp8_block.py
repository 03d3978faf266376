"""DeepSeek-V3/R1 and Kimi K2 as published: FP8 E4M3 weights with one fp32 scale per 128x128 block.

config.json: `quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
"dynamic", "weight_block_size": [128, 128]}`. Each quantized Linear stores `X.weight`
float8_e4m3fn [N, K] and `X.weight_scale_inv` float32 [ceil(N/128), ceil(K/128)], a
dequant *multiplier* despite its name (DeepSeek's inference/kernel.py `weight_dequant`:
y = x * s, then the default dtype bf16). Everything else (router, norms, embeddings,
lm_head) is stored in bf16 and passes through.
"""

from __future__ import annotations

import torch

from tfcompile.errors import CheckpointError
from tfcompile.io.sources.base import DequantizedSource
from tfcompile.io.sources.deepseek_v4 import is_v4, open_deepseek_v4
from tfcompile.io.sources.scales import FLOAT_CODES, cdiv, check_header, check_values
from tfcompile.kernels.formats import dequantize, weight_quantizer

SUFFIX = ".weight_scale_inv"
QUANT_METHOD = "fp8"  # config.json quantization_config.quant_method of the checkpoints read here (HF's name)


def _block(qc: dict) -> tuple:
    """weight_block_size as two positive ints, or () (refused by the caller)."""
    block = qc.get("weight_block_size")
    ok = isinstance(block, list) and len(block) == 2 and all(type(b) is int and 0 < b <= 1 << 16 for b in block)
    return tuple(block) if ok else ()


def open_fp8_block(ckpt, qc: dict) -> DequantizedSource:
    block = _block(qc)
    if len(block) == 2 and is_v4(qc):  # DeepSeek-V4: E8M0 block scales, FP4 experts (deepseek_v4.py)
        return open_deepseek_v4(ckpt, qc, block)
    if len(block) != 2 or qc.get("fmt", "e4m3") != "e4m3":
        raise CheckpointError(f"{ckpt.path}/config.json: quant_method fp8 with weight_block_size "
                              f"{str(qc.get('weight_block_size'))[:60]} "
                              f"and fmt {qc.get('fmt')!r} is not a format tfcompile reads",
                              hint="tfcompile reads FP8 E4M3 checkpoints with 2-D weight blocks (DeepSeek-V3 "
                                   "style); dequantize it to bf16 first")
    decoders, hidden = {}, set()
    for scale_name in [n for n in ckpt.names() if n.endswith(SUFFIX)]:
        w = scale_name[: -len(SUFFIX)] + ".weight"
        info = ckpt.info(w)
        if info.dtype != "F8_E4M3" or len(info.shape) != 2:
            raise CheckpointError(f"{ckpt.path}: {w} is {info.dtype} {list(info.shape)} beside {scale_name}; "
                                  f"expected a 2-D F8_E4M3 weight", hint="the checkpoint is not DeepSeek FP8-block")
        n, k = info.shape
        check_header(ckpt, scale_name, w, FLOAT_CODES, [(cdiv(n, block[0]), cdiv(k, block[1]))])
        decoders[w] = (tuple(info.shape), w, _decoder(ckpt, w, scale_name, tuple(info.shape), block))
        hidden.add(scale_name)
    return DequantizedSource(ckpt, decoders, hidden, {"format": "fp8-block", "quant_method": "fp8",
                                                      "weight_block_size": list(block),
                                                      "dequantized_tensors": len(decoders)})


def _decoder(ckpt, w: str, s: str, shape: tuple[int, int], block: tuple[int, int]):
    def decode() -> torch.Tensor:
        scale = check_values(ckpt.path, s, ckpt.get(s), per_block=True)
        q = weight_quantizer("fp8", "block", block).from_stored(ckpt.get(w), scale, None, shape)
        return dequantize(q, torch.bfloat16)

    return decode
