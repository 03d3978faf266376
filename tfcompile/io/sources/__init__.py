"""Published checkpoint formats read as they are: `open_source(dir)`.

A bf16/fp16/fp32 checkpoint opens as itself. A quantized one opens as the bf16 model it
encodes (`DequantizedSource`, decoded tensor by tensor on demand), chosen by config.json's
`quantization_config.quant_method`:

| quant_method        | format                                   | module |
|---------------------|------------------------------------------|--------|
| fp8 (+ weight_block_size) | DeepSeek-V3/R1, Kimi K2: E4M3 + `weight_scale_inv` per block | fp8_block.py |
| fp8 + scale_fmt ue8m0    | DeepSeek-V4: E4M3 + E8M0 `scale` per block, FP4 experts + E8M0 per 32 | deepseek_v4.py |
| mxfp4               | GPT-OSS: experts as `*_blocks` + `*_scales` | mxfp4.py |
| compressed-tensors  | tfcompile / llm-compressor artifacts (re-quantization); Kimi K2-Thinking / K2.5 INT4 pack-quantized experts | compressed.py, int4_pack.py |

Anything else is refused with a hint. The manifest records `source.format`.
"""

from __future__ import annotations

import os

from tfcompile.errors import CheckpointError
from tfcompile.io.checkpoint import Checkpoint, open_checkpoint
from tfcompile.io.sources.compressed import open_compressed
from tfcompile.io.sources import fp8_block, mxfp4

# by quant_method, each reader's own (Hugging Face's names, not tfcompile formats)
READERS = {fp8_block.QUANT_METHOD: fp8_block.open_fp8_block, mxfp4.QUANT_METHOD: mxfp4.open_mxfp4,
           "compressed-tensors": open_compressed}


def open_source(path: str | os.PathLike) -> Checkpoint:
    """The checkpoint at `path`, quantized formats decoded to the bf16 model they encode."""
    ckpt = open_checkpoint(path)
    qc = ckpt.config.get("quantization_config")
    if not qc:
        return ckpt
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method not in READERS:
        raise CheckpointError(f"{ckpt.path}/config.json: quantization_config quant_method {method!r} is not a "
                              f"format tfcompile reads ({', '.join(sorted(READERS))})",
                              hint="start from the bf16 checkpoint, or dequantize it with the tool that made it")
    return READERS[method](ckpt, qc)


def source_format(source) -> dict:
    """The manifest's source.format entry."""
    return getattr(source, "source_format", None) or {"format": "safetensors"}


__all__ = ["open_source", "source_format", "READERS"]
