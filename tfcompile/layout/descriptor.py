"""The KV-cache descriptor, OUT/tfcompile/kv_cache.json: how the target engine's paged KV cache
is laid out and encoded for this artifact.

Fields (docs/formats.md "KV-cache descriptor"):
  engine, backend, rules_source   the target and where its rules come from (tfcompile/engines.py)
  layout                          NHD: a page is [block_size, num_kv_heads, head_dim_padded];
                                  HND: [num_kv_heads, block_size, head_dim_padded]
  page_shape                      that shape with numbers (per layer, K and V each)
  block_size                      tokens per page
  num_layers, num_kv_heads        KV heads of the view (after TP replication), kv_heads_per_shard, tp
  head_dim, head_dim_padded       padding rows are zeros (q is padded alike, so q.k is unchanged)
  rope                            "half" or "interleaved": the order K is cached in (post-RoPE)
  dtype                           bf16 | fp16 | fp8_e4m3 | nvfp4
  scales                          null for bf16/fp16; else the scale tensors, their granularity,
                                  how the engine reads them and the direction (dequant multiplier)
  nvfp4                           for NVFP4 KV: block 16 along head_dim, E4M3 block scales computed
                                  when a token is written, global multiplier 6 / k_scale
  warnings                        what the target does differently (per-head scales collapsed ...)
  attention                       "mha" (every layer as above), or the kinds present: mla, sliding,
                                  linear (+sinks); then `layers` describes each decoder layer
                                  (tfcompile/layout/variants.py) and an all-MLA model's top-level
                                  page_shape / num_kv_heads / head_dim are its latent entry's
"""

from __future__ import annotations

from tfcompile.layout.engines import rules_for
from tfcompile.layout.plan import LayoutPlan, pattern
from tfcompile.layout.variants import attention_layers
from tfcompile.schemes import KV_BY_DTYPE, KV_ENCODING_FIELD, kv_encoding

DESCRIPTOR = "tfcompile/kv_cache.json"
SCHEMA = 1


def page_shape(layout: str, block: int, kv_heads: int, head_dim: int) -> list[int]:
    return [block, kv_heads, head_dim] if layout == "NHD" else [kv_heads, block, head_dim]


def build_descriptor(lp: LayoutPlan, *, num_layers: int | None, kv_strategy: str | None,
                     kv_modules: tuple[str, ...], head_dim: int | None, config: dict | None = None) -> dict:
    s = lp.spec
    h = lp.heads
    kv_heads = h.view_kv_heads if h else None
    per_shard = h.kv_per_shard if h else None
    doc = {
        "schema_version": SCHEMA,
        "engine": s.target, "backend": s.backend, "rules_source": rules_for(s.target, s.backend).source,
        "layout": s.kv_layout,
        "page_shape": page_shape(s.kv_layout, s.block_size, per_shard, s.head_dim_pad) if h else None,
        "block_size": s.block_size,
        "num_layers": num_layers,
        "num_kv_heads": kv_heads, "kv_heads_per_shard": per_shard, "tp": s.tp,
        "head_dim": head_dim, "head_dim_padded": s.head_dim_pad,
        "rope": s.rope,
        "dtype": s.kv_dtype,
        "scales": _scales(lp, kv_strategy, kv_modules),
        KV_ENCODING_FIELD: kv_encoding(s.kv_dtype),  # the format's (NVFP4: block 16, E4M3 scales, E2M1)
        "warnings": list(lp.warnings),
    }
    summary, layers = attention_layers(config or {}, block=s.block_size, layout=s.kv_layout, kv_heads=per_shard,
                                       head_dim=s.head_dim_pad, kv_modules=kv_modules, dtype=s.kv_dtype)
    doc["attention"] = summary
    if summary != "mha":
        doc["layers"] = layers
    if layers and all(e["kind"] == "mla" for e in layers):  # one latent entry per token, no heads
        doc.update(page_shape=layers[0]["page_shape"], num_kv_heads=1, kv_heads_per_shard=1,
                   head_dim=layers[0]["entry_dim"], head_dim_padded=layers[0]["entry_dim"])
        if doc["scales"]:
            doc["scales"].update(granularity="tensor", shape=[1], engine_reads="k_scale for the whole entry",
                                 source="calibrated max(|c_kv|, |k_pe|) / 448 of the cached latent and RoPE key "
                                        "(--kv-cache fp8); v_scale holds the same value")
    return doc


def _scales(lp: LayoutPlan, strategy: str | None, modules: tuple[str, ...]) -> dict | None:
    if lp.spec.kv_dtype not in KV_BY_DTYPE:
        return None
    n = lp.heads.view_kv_heads if (lp.heads and strategy == "attn_head") else 1
    return {"tensors": sorted({pattern(m) + ".k_scale" for m in modules} | {pattern(m) + ".v_scale"
                                                                             for m in modules}),
            "modules": len(modules),
            "granularity": "attn_head" if strategy == "attn_head" else "tensor",
            "shape": [n, 1, 1] if strategy == "attn_head" else [1],
            "engine_reads": lp.spec.engine_scale,
            "direction": "dequant multiplier: cache = e4m3(x / scale), x ~= cache * scale",
            "source": "calibrated max|K|, max|V| / 448 after RoPE and q/k norms (--kv-cache fp8)"}
