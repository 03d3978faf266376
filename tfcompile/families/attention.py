"""Attention variants: what each decoder layer caches, and how to wrap its attention without changing it.

Per layer (`layer_kinds`, from config.json alone):
- "full":    standard (GQA) attention; the KV cache holds K and V per KV head.
- "sliding": the same cache, but a layer attends to the last `window` tokens only
             (GPT-OSS's alternate layers; engines may keep only the window).
- "mla":     DeepSeek-V3 multi-head latent attention: the cache holds one entry per
             token, the compressed latent c_kv (kv_lora_rank, after kv_a_layernorm) and
             the RoPE key k_pe (qk_rope_head_dim, after RoPE), shared by all heads; K and
             V are expanded from it by kv_b_proj (vLLM `concat_and_cache_mla`, SGLang
             `MLATokenToKVPool`). transformers 5 caches exactly that pair and expands it in
             `DeepseekV3Attention.expand_kv`.
- "linear":  Qwen3-Next Gated DeltaNet: no KV cache at all, a fixed-size recurrent state
             (conv state + per-head state matrix) instead.
`sinks` marks GPT-OSS's learned per-head attention-sink logits (softmax over [scores, sink]).

`original_attention(model)` is the attention function the model runs by default, so a
wrapper registered in transformers' AttentionInterface (KV observation, FP8 KV emulation)
calls it and not SDPA: GPT-OSS runs eager attention because SDPA cannot express sinks.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping


# RoPE convention of Hugging Face model code per model_type (transformers 5: `rotate_half`): what the
# layout pass compares with an engine's (passes/layout.py)
SOURCE_ROPE = {t: "half" for t in (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi3", "granite", "granitemoe", "olmo", "olmo2", "smollm3", "ministral")}


def layer_kinds(config: Mapping[str, Any]) -> list[dict]:
    """One dict per decoder layer: {"kind", "kv_cache", "window", "sinks"} (+ MLA sizes)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    n = int(text.get("num_hidden_layers") or 0)
    types = text.get("layer_types") or ["full_attention"] * n
    sinks = text.get("model_type") == "gpt_oss" or config.get("model_type") == "gpt_oss"
    out = []
    for t in types[:n]:
        if text.get("kv_lora_rank"):
            out.append({"kind": "mla", "kv_cache": True, "window": None, "sinks": False,
                        "latent_dim": int(text["kv_lora_rank"]), "rope_dim": int(text["qk_rope_head_dim"])})
        elif t == "linear_attention":
            out.append({"kind": "linear", "kv_cache": False, "window": None, "sinks": False})
        elif t == "sliding_attention":
            out.append({"kind": "sliding", "kv_cache": True, "window": int(text["sliding_window"]), "sinks": sinks})
        else:
            out.append({"kind": "full", "kv_cache": True, "window": None, "sinks": sinks})
    return out


def is_mla(module) -> bool:
    """A DeepSeek-style latent attention module (caches c_kv + k_pe, expands them with kv_b_proj)."""
    return hasattr(module, "kv_b_proj") and hasattr(module, "expand_kv") and hasattr(module, "kv_lora_rank")


def original_attention(model) -> Callable:
    """The attention function `model` would call (before any set_attn_implementation of ours)."""
    # lazy: transformers (~2 s to import); only when a model is built
    from transformers import AttentionInterface

    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl == "sdpa":  # looked up per call (tests watch what SDPA receives)
        # lazy: transformers (~2 s to import); only when a model is built
        from transformers.integrations import sdpa_attention

        return lambda *args, **kwargs: sdpa_attention.sdpa_attention_forward(*args, **kwargs)
    if impl != "eager" and impl in AttentionInterface._global_mapping:
        return AttentionInterface._global_mapping[impl]

    def eager(module, *args, **kwargs):  # the architecture's own eager function (GPT-OSS: with sinks)
        return sys.modules[type(module).__module__].eager_attention_forward(module, *args, **kwargs)

    return eager


def register_wrapper(name: str, model, make: Callable[[Callable], Callable]) -> str:
    """Register `make(original attention of model)` in transformers' AttentionInterface, with the
    original implementation's mask function; returns the name to `set_attn_implementation`.

    The mask matters: transformers builds no mask at all for an attention name it has no mask
    function for, which SDPA survives (is_causal) but eager attention (GPT-OSS) and sliding
    windows do not. One name per original implementation, since the mask is looked up by name."""
    # lazy: transformers (~2 s to import); only when a model is built
    # lazy: transformers (~2 s to import); only when a model is built
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    full = f"{name}_{impl}"
    AttentionInterface.register(full, make(original_attention(model)))
    mask = AttentionMaskInterface._global_mapping.get(impl)
    if mask is not None:
        AttentionMaskInterface.register(full, mask)
    return full
