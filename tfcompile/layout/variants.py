"""Attention variants in the KV-cache descriptor: one entry per decoder layer.

kv_cache.json's top-level fields describe a standard per-KV-head cache. A model
whose layers differ says so per layer in `layers` (tfcompile/families/attention.py
reads the kinds from config.json), and the top level summarises (`attention`):

- full / sliding: K and V per KV head, page [block, kv_heads, head_dim] (NHD);
  sliding layers add `window` (the tokens a query attends to; an engine may free
  pages older than that); GPT-OSS layers add `sinks`, the per-head sink-logit
  tensor the backend must apply (softmax over [scores, sink]).
- mla: one entry per token and layer, the latent c_kv (kv_lora_rank, after
  kv_a_layernorm) then the RoPE key k_pe (qk_rope_head_dim, after RoPE):
  `entry_dim` = kv_lora_rank + qk_rope_head_dim values, one "head", page
  [block, entry_dim] (vLLM `concat_and_cache_mla`: kv_cache [blocks, block_size,
  kv_lora_rank + pe_dim]; SGLang `MLATokenToKVPool`). An FP8 cache stores the whole
  entry with the layer's one `k_scale` (calibrated as max(|c_kv|, |k_pe|) / 448);
  `v_scale` is written with the same value and MLA kernels do not read it.
- linear: Gated DeltaNet (Qwen3-Next) has no KV cache; its conv and recurrent
  state are fixed-size per sequence (`state`), not paged and not quantized.

Checked by running them (tests/families/test_attention_variants.py): the paged
reference attention with the descriptor's window / sinks / MLA entry reproduces
transformers' attention of those layers.
"""

from __future__ import annotations

from typing import Any, Mapping

from tfcompile.families.attention import layer_kinds
from tfcompile.schemes import KV_BY_DTYPE


def attention_layers(config: Mapping[str, Any], *, block: int, layout: str, kv_heads: int | None,
                     head_dim: int | None, kv_modules: tuple[str, ...], dtype: str) -> tuple[str, list[dict]]:
    """(summary, per-layer entries) for kv_cache.json; summary is "mha" when every layer is standard."""
    kinds = layer_kinds(config)
    quantized = dtype in KV_BY_DTYPE
    by_layer = {_layer_of(m): m for m in kv_modules}
    out = []
    for i, k in enumerate(kinds):
        e = {"layer": i, "kind": k["kind"], "kv_cache": k["kv_cache"]}
        attn = by_layer.get(i)
        if k["kind"] == "linear":
            e["state"] = "conv state + per-head recurrent state (Gated DeltaNet): fixed size, not paged"
        elif k["kind"] == "mla":
            entry = k["latent_dim"] + k["rope_dim"]
            e.update(latent_dim=k["latent_dim"], rope_dim=k["rope_dim"], entry_dim=entry, num_kv_heads=1,
                     page_shape=[block, entry])
            if quantized and attn:
                e["scales"] = {"k_scale": f"{attn}.k_scale", "covers": "c_kv and k_pe (the whole entry)",
                               "v_scale": f"{attn}.v_scale (same value; not read by MLA kernels)"}
        else:
            e.update(num_kv_heads=kv_heads, head_dim=head_dim,
                     page_shape=[block, kv_heads, head_dim] if layout == "NHD" else [kv_heads, block, head_dim])
            if k["window"]:
                e["window"] = k["window"]
            if k["sinks"]:
                e["sinks"] = f"{attn or f'model.layers.{i}.self_attn'}.sinks"
            if quantized and attn:
                e["scales"] = {"k_scale": f"{attn}.k_scale", "v_scale": f"{attn}.v_scale"}
        out.append(e)
    names = {e["kind"] for e in out}
    summary = "mha" if names <= {"full"} and not any(e.get("sinks") for e in out) else \
        "+".join(sorted(names)) + ("+sinks" if any(e.get("sinks") for e in out) else "")
    return summary, out


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    for a, b in zip(parts, parts[1:]):
        if a in ("layers", "layer", "h", "blocks") and b.isdigit():
            return int(b)
    return None
