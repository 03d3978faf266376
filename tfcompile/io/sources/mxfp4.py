"""GPT-OSS as published: MoE experts in MXFP4 (`*_blocks` + `*_scales`), everything else bf16.

config.json: `quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [...]}`.
Per layer: `mlp.experts.gate_up_proj_blocks` uint8 [E, 2I, H/32, 16] and
`gate_up_proj_scales` uint8 [E, 2I, H/32]; `down_proj_blocks` [E, H, I/32, 16] and
`down_proj_scales` [E, H, I/32]: per expert an [out, in] weight, two E2M1 codes per byte
(low nibble first), one E8M0 scale per 32 along `in`. transformers' GPT-OSS conversion
(integrations/mxfp4.py `convert_moe_packed_tensors`) decodes them and transposes to the
model's in-memory layout, gate_up_proj [E, H, 2I] and down_proj [E, I, H]: the names and
shapes a bf16 GPT-OSS checkpoint has, which is what this source presents. Biases are bf16.

`get_expert(name, e)` decodes one expert (pack quantizes expert by expert, so a layer's
fused tensor is never decoded whole for it).
"""

from __future__ import annotations

import torch

from tfcompile.errors import CheckpointError
from tfcompile.io.sources.base import DequantizedSource
from tfcompile.kernels.formats import dequantize, weight_quantizer


QUANT_METHOD = "mxfp4"  # config.json quantization_config.quant_method of GPT-OSS (HF's name)


def open_mxfp4(ckpt, qc: dict) -> "Mxfp4Source":
    decoders, hidden = {}, set()
    for blocks in [n for n in ckpt.names() if n.endswith("_blocks")]:
        base = blocks[: -len("_blocks")]
        scales = base + "_scales"
        b, s = ckpt.info(blocks), ckpt.info(scales) if scales in ckpt.names() else None
        if s is None or b.dtype != "U8" or s.dtype != "U8" or len(b.shape) != 4 or tuple(b.shape[:3]) != tuple(s.shape) \
                or b.shape[3] != 16:
            raise CheckpointError(f"{ckpt.path}: {blocks} {b.dtype} {list(b.shape)} / {scales} "
                                  f"{s and s.dtype} {s and list(s.shape)} are not MXFP4 blocks [E, N, K/32, 16] "
                                  f"with E8M0 scales [E, N, K/32]", hint="the checkpoint is not GPT-OSS MXFP4")
        e, n, kb, _ = b.shape
        decoders[base] = ((e, kb * 32, n), blocks, _decoder(ckpt, blocks, scales, None))
        hidden |= {blocks, scales}
    return Mxfp4Source(ckpt, decoders, hidden, {"format": "mxfp4", "quant_method": "mxfp4",
                                                "dequantized_tensors": len(decoders)})


class Mxfp4Source(DequantizedSource):
    _last: tuple = (None, None)  # ((name, expert), tensor): gate and up read the same expert back to back

    def get_expert(self, name: str, e: int) -> torch.Tensor:
        """Expert e of the fused tensor `name`, [in, out] as the model holds it (bf16)."""
        if name not in self._decoders:
            return self.get(name)[e]
        if self._last[0] != (name, e):
            self._last = ((name, e), _decoder(self.inner, name + "_blocks", name + "_scales", e)())
        return self._last[1]


def _decoder(ckpt, blocks: str, scales: str, expert: int | None):
    def decode() -> torch.Tensor:
        b, s = ckpt.get(blocks), ckpt.get(scales)
        if expert is not None:
            b, s = b[expert], s[expert]
        data = b.reshape(*b.shape[:-2], b.shape[-2] * 16)  # [.., N, K/2] packed along K
        q = weight_quantizer("mxfp4").from_stored(data, s, None, (*data.shape[:-1], data.shape[-1] * 2))
        return dequantize(q, torch.bfloat16).transpose(-1, -2).contiguous()  # [.., K, N]: the model's layout

    return decode
