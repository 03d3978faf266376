"""A model's tensors and per-layer work from config.json alone: transformers builds it on the
meta device (no memory, no weights; DeepSeek-V3's 671B in ~3 s), and we read its parameters.

What it gives the estimator: every tensor the checkpoint holds (name, shape, source dtype),
so the select and quantize passes plan the exact output tensors; and per decoder layer the
Linear shapes, the parameters a token goes through (MoE: top-k of the routed experts plus the
shared ones), and the attention sizes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tfcompile.checkpoint_check import build_meta_model
from tfcompile.errors import CheckpointError
from tfcompile.io.checkpoint import read_config_file
from tfcompile.io.sources.fp8_block import QUANT_METHOD as FP8_QUANT_METHOD

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_CODES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors code of the source checkpoint

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}[self.dtype]


@dataclass(frozen=True)
class Layer:
    index: int
    params: int  # every parameter of the decoder layer
    active: int  # parameters one token's forward multiplies (MoE: top-k + shared experts)
    source_bytes: int
    linears: tuple[tuple[str, int, int, int], ...]  # (name, rows N, cols K, experts E or 1)
    hidden: int
    attn: tuple[int, int, int]  # (heads, q.k dim per head, v dim per head)
    inter: int  # widest intermediate activation per token (MLP, or top-k x expert width)
    routed: float = 1.0  # share of the layer's tokens one routed expert sees on average (top-k / E)


@dataclass(frozen=True)
class ModelShape:
    config: dict
    tensors: tuple[Tensor, ...]
    layers: tuple[Layer, ...]
    params: int
    hidden: int
    vocab: int

    @property
    def source_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def read_config(path: Path) -> tuple[Path, dict]:
    """MODEL is a directory with config.json (weights not needed) or a config.json itself: read and
    range-checked as quantize reads it (tfcompile/io/checkpoint.py: a regular file under the size and
    nesting limits, `architectures` and `model_type` given, every size in range)."""
    path = Path(path)
    f = path / "config.json" if path.is_dir() else path
    if not os.path.lexists(f):
        raise CheckpointError(f"{f}: no such file", hint="plan --estimate needs MODEL/config.json (no weights)")
    return f.parent, read_config_file(f)


def model_shape(path: Path) -> ModelShape:
    model_dir, cfg = read_config(path)
    model = build_meta_model(cfg, f"{model_dir}/config.json")  # CheckpointError when transformers cannot
    if model is None:
        raise CheckpointError(f"{model_dir}/config.json: architecture {cfg['architectures'][0]!r} is not in "
                              "transformers", hint="plan --estimate builds the model from its transformers class")
    config = model.config
    code = _CODES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"), "BF16")
    fp8 = (cfg.get("quantization_config") or {}).get("quant_method") == FP8_QUANT_METHOD  # DeepSeek-V3's source
    tensors = tuple(Tensor(n, tuple(p.shape), "F8_E4M3" if fp8 and _is_weight(n, p) else code)
                    for n, p in model.state_dict().items())
    text = getattr(config, "text_config", None) or config
    layers = _layers(model, tensors, text)
    return ModelShape(cfg, tensors, layers, sum(math.prod(t.shape) for t in tensors),
                      int(text.hidden_size), int(text.vocab_size))


def _is_weight(name: str, p) -> bool:
    """Linear weights of decoder layers (what an FP8 block-quantized source stores in FP8)."""
    return _LAYER.search(name) is not None and p.dim() in (2, 3) and "norm" not in name and ".gate." not in name


def _layers(model, tensors, text) -> tuple[Layer, ...]:
    from torch import nn  # lazy: torch (see model_shape)

    top_k = int(getattr(text, "num_experts_per_tok", 0) or getattr(text, "num_experts_per_token", 0) or 0)
    by_layer: dict[int, list[Tensor]] = {}
    for t in tensors:
        m = _LAYER.search(t.name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append(t)
    heads = int(getattr(text, "num_attention_heads", 1))
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    qk = int(getattr(text, "qk_nope_head_dim", 0) + getattr(text, "qk_rope_head_dim", 0)) or head_dim
    v = int(getattr(text, "v_head_dim", 0) or head_dim)
    linear_names = {n for n, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    out = []
    for i, ts in sorted(by_layer.items()):
        params = sum(math.prod(t.shape) for t in ts)
        linears, active, inter, routed = [], 0, 0, 1.0
        for t in ts:
            module = t.name.removesuffix(".weight")
            if len(t.shape) == 3 and "experts" in t.name:  # fused experts [E, N, K]
                e, n, k = t.shape
                linears.append((module, n, k, e))
                active += min(top_k or e, e) * n * k
                inter = max(inter, min(top_k or e, e) * n)
                routed = min(top_k or e, e) / e
            elif len(t.shape) == 2 and module in linear_names:
                linears.append((module, t.shape[0], t.shape[1], 1))
                active += t.shape[0] * t.shape[1]
                inter = max(inter, t.shape[0])
            else:
                active += math.prod(t.shape) if len(t.shape) == 1 else 0
        out.append(Layer(i, params, active, sum(t.nbytes for t in ts), tuple(linears), int(text.hidden_size),
                         (heads, qk, v), inter, routed))
    return tuple(out)
