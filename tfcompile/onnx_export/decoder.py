"""The decoder-only Llama-family graph (Llama, Mistral, Qwen2, Qwen3), built node by node.

Inputs: input_ids, attention_mask INT64 [batch, sequence] (1 = token, 0 =
padding); output: logits FLOAT [batch, sequence, vocab]. A full-sequence
forward with no KV cache, positions 0..sequence-1 (as transformers without
position_ids). Everything computes in float32: non-quantized weights stay in
their stored dtype and are Cast, quantized ones are dequantized by
qlinear.py. Layer by layer, each tensor is read from the memory-mapped
artifact, streamed to the output and its pages released, so memory follows
one decoder layer, never the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from onnx import TensorProto

from tfcompile.onnx_export.config import OnnxExportError
from tfcompile.onnx_export.graph import F32, Graph
from tfcompile.onnx_export.qlinear import linear, plain_weight
from tfcompile.onnx_export.source import ArtifactView, Tensors, kv_strategy
from tfcompile.onnx_export.writer import onnx_type

NEG = float(np.finfo(np.float32).min)  # additive mask: exp underflows to 0, a fully masked row stays finite


@dataclass(frozen=True)
class Arch:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    tied: bool  # lm_head shares embed_tokens

    @staticmethod
    def of(cfg: Mapping[str, Any]) -> "Arch":
        h, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return Arch(int(cfg["num_hidden_layers"]), h, nh, int(cfg.get("num_key_value_heads") or nh),
                    int(cfg.get("head_dim") or h // nh), int(cfg["vocab_size"]), float(cfg.get("rms_norm_eps", 1e-6)),
                    bool(cfg.get("tie_word_embeddings", False)))


def rope_tables(cfg: Mapping[str, Any], head_dim: int) -> tuple[np.ndarray, float]:
    """(inv_freq float32 [head_dim/2], attention_scaling) as transformers computes them."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":  # transformers' compute_default_rope_parameters
        base = float(rope["rope_theta"])
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim))
        return inv.numpy(), 1.0
    if kind in ("dynamic", "longrope"):
        raise OnnxExportError(f"rope_type {kind!r} depends on the sequence length and is not exported",
                              hint="export a model with static RoPE (default, linear, llama3, yarn)")
    import transformers  # lazy: transformers (~2 s to import); only when a model is built
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if kind not in ROPE_INIT_FUNCTIONS:
        raise OnnxExportError(f"unknown rope_type {kind!r}", hint="see transformers' ROPE_INIT_FUNCTIONS")
    conf = transformers.PretrainedConfig.from_dict({**cfg, "rope_parameters": rope})
    conf.head_dim = head_dim
    inv, scaling = ROPE_INIT_FUNCTIONS[kind](conf, None)
    return inv.float().numpy(), float(scaling)


class Decoder:
    """Emits the graph of one artifact into `g`, reading tensors from `t`."""

    def __init__(self, g: Graph, t: Tensors, view: ArtifactView):
        self.g, self.t, self.view = g, t, view
        self.a = Arch.of(view.config)
        self.kv = kv_strategy(view.config) if view.kv_modules else None

    def build(self) -> str:
        """All nodes; returns the name of the logits output."""
        g, a = self.g, self.a
        self._prelude()
        with g.scope("model/embed_tokens"):
            emb = self.t.get("model.embed_tokens.weight")
            w = g.initializer("model.embed_tokens.weight", onnx_type(emb.dtype), emb.shape, emb)
            h = g.op("Gather", [w, "input_ids"])  # [B, S, H] in the stored dtype
            h = h if emb.dtype == torch.float32 else g.op("Cast", [h], to=F32)
        for i in range(a.layers):
            with g.scope(f"model/layers.{i}"):
                h = self._layer(i, h)
            self.t.release()  # this layer's pages leave the resident set
        with g.scope("model/norm"):
            h = self._rmsnorm(h, "model.norm.weight")
        if self.t.has("lm_head.weight"):
            return self._linear("lm_head", h, out="logits")
        with g.scope("lm_head"):  # tied: the embedding matrix is the output projection
            wt = g.op("Transpose", [g.op("Cast", [w], to=F32) if emb.dtype != torch.float32 else w], perm=[1, 0])
            return g.op("MatMul", [h, wt], out="logits")

    def _prelude(self) -> None:
        """Position tables [1, 1, S, head_dim] and the additive attention bias [B, 1, S, S]."""
        g = self.g
        with g.scope("model/rotary_emb"):
            s = g.op("Squeeze", [g.op("Shape", ["input_ids"], start=1, end=2), g.ints(0)])  # S (scalar)
            pos = g.op("Range", [g.const(0, np.int64), s, g.const(1, np.int64)])  # [S]
            inv, scaling = rope_tables(self.view.config, self.a.head_dim)
            freqs = g.op("Mul", [g.op("Unsqueeze", [g.op("Cast", [pos], to=F32), g.ints(1)]),
                                 g.small("model.rotary_emb.inv_freq", inv.astype(np.float32))])  # [S, hd/2]
            emb = g.op("Concat", [freqs, freqs], axis=-1)  # [S, hd]
            tables = []
            for fn in ("Cos", "Sin"):
                v = g.op(fn, [emb])
                v = v if scaling == 1.0 else g.op("Mul", [v, g.const(scaling)])
                tables.append(g.op("Unsqueeze", [v, g.ints(0, 1)]))
            self.cos, self.sin = tables
        with g.scope("model/mask"):
            future = g.op("Greater", [g.op("Unsqueeze", [pos, g.ints(0)]), g.op("Unsqueeze", [pos, g.ints(1)])])
            pad = g.op("Not", [g.op("Cast", ["attention_mask"], to=TensorProto.BOOL)])  # [B, S]
            masked = g.op("Or", [future, g.op("Unsqueeze", [pad, g.ints(1, 2)])])  # [B, 1, S, S]
            self.bias = g.op("Where", [masked, g.const(NEG), g.const(0.0)])

    def _layer(self, i: int, h: str) -> str:
        p = f"model.layers.{i}"
        with self.g.scope("self_attn"):
            x = self._rmsnorm(h, f"{p}.input_layernorm.weight")
            h = self.g.op("Add", [h, self._attention(f"{p}.self_attn", x)])
        with self.g.scope("mlp"):
            x = self._rmsnorm(h, f"{p}.post_attention_layernorm.weight")
            gate = self._linear(f"{p}.mlp.gate_proj", x)
            up = self._linear(f"{p}.mlp.up_proj", x)
            act = self.g.op("Mul", [self.g.op("Mul", [gate, self.g.op("Sigmoid", [gate])]), up])  # SiLU(gate) * up
            return self.g.op("Add", [h, self._linear(f"{p}.mlp.down_proj", act)])

    def _attention(self, m: str, x: str) -> str:
        g, a = self.g, self.a
        q = self._heads(m, "q", x, a.heads)  # [B, nH, S, hd]
        k = self._heads(m, "k", x, a.kv_heads)  # [B, nKV, S, hd]
        v = self._heads(m, "v", x, a.kv_heads)
        q, k = self._rope(q), self._rope(k)
        if m in self.view.kv_modules:  # FP8 KV cache: what the engine stores and reads back
            k, v = self._kv_qdq(m, "k", k), self._kv_qdq(m, "v", v)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])  # [B, nH, S, S]
        scores = g.op("Add", [g.op("Mul", [scores, g.const(a.head_dim ** -0.5)]), self.bias])
        o = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])  # [B, nH, S, hd]
        o = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), g.ints(0, 0, a.heads * a.head_dim)])
        return self._linear(f"{m}.o_proj", o)

    def _heads(self, m: str, which: str, x: str, n: int) -> str:
        """x [B, S, H] -> projection split into heads [B, n, S, hd] (q/k norms applied per head)."""
        g = self.g
        y = g.op("Reshape", [self._linear(f"{m}.{which}_proj", x), g.ints(0, 0, n, self.a.head_dim)])
        if which != "v" and self.t.has(f"{m}.{which}_norm.weight"):  # Qwen3
            y = self._rmsnorm(y, f"{m}.{which}_norm.weight")
        return g.op("Transpose", [y], perm=[0, 2, 1, 3])

    def _rope(self, x: str) -> str:
        """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (halves of head_dim)."""
        g, half = self.g, self.a.head_dim // 2
        x1, x2 = g.op("Split", [x, g.ints(half, half)], outputs=2, axis=-1)
        rot = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
        return g.op("Add", [g.op("Mul", [x, self.cos]), g.op("Mul", [rot, self.sin])])

    def _repeat_kv(self, x: str) -> str:
        """[B, nKV, S, hd] -> [B, nH, S, hd], each KV head repeated nH/nKV times (GQA)."""
        rep = self.a.heads // self.a.kv_heads
        if rep == 1:
            return x
        g = self.g
        x = g.op("Expand", [g.op("Unsqueeze", [x, g.ints(2)]), g.ints(1, 1, rep, 1, 1)])
        return g.op("Reshape", [x, g.ints(0, self.a.heads, -1, self.a.head_dim)])

    def _kv_qdq(self, m: str, which: str, x: str) -> str:
        """FP8 E4M3 KV cache: QuantizeLinear/DequantizeLinear with the artifact's k_scale / v_scale,
        per tensor (scalar) or per KV head ([nKV] along axis 1 of [B, nKV, S, hd])."""
        g, name = self.g, f"{m}.{which}_scale"
        s = self.t.get(name).detach().float()
        per_head = self.kv == "attn_head"
        scale = g.small(name, s.reshape((self.a.kv_heads,) if per_head else ()).numpy())
        axis = {"axis": 1} if per_head else {}
        zero = g.fp8_zero(self.a.kv_heads if per_head else None)
        q = g.op("QuantizeLinear", [x, scale, zero], saturate=1, **axis)
        return g.op("DequantizeLinear", [q, scale], **axis)

    def _rmsnorm(self, x: str, w: str) -> str:
        """x / sqrt(mean(x^2) + eps) * w over the last axis (transformers' RMSNorm in float32)."""
        g = self.g
        var = g.op("ReduceMean", [g.op("Mul", [x, x]), g.ints(-1)], keepdims=1)
        r = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, g.const(self.a.eps)])])])
        return g.op("Mul", [g.op("Mul", [x, r]), plain_weight(g, self.t, w)])

    def _linear(self, m: str, x: str, out: str | None = None) -> str:
        y = linear(self.g, self.t, self.view.scheme, m, x, self.view.layers.get(m))
        return self.g.op("Identity", [y], out=out) if out else y
