"""Observe the attention's keys and values as the KV cache stores them.

Attention modules are found by what they do, not by a forward argument's
name (transformers 5 renamed `past_key_value`, and compressed-tensors' KV
calibration silently skips attention because of it): transformers 5 routes
every attention call through `AttentionInterface`, handing the function the
module and the key/value states *after* RoPE and q/k norms, shaped
(batch, kv_heads, seq, head_dim) — exactly what the engine writes into its
cache. We register an observing wrapper around SDPA and select it with
`attn_implementation`.
"""

from __future__ import annotations

from typing import Any

import torch

OBSERVER = "tfcompile_kv_observer"


class KVObserver:
    """Per attention module: max |K| and max |V|, per KV head (float32 [kv_heads])."""

    def __init__(self, model: torch.nn.Module):
        self._names = {id(m): n for n, m in model.named_modules()}
        self.k: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def record(self, module: Any, key: torch.Tensor, value: torch.Tensor) -> None:
        name = self._names.get(id(module))
        if name is None:
            return
        for store, t in ((self.k, key), (self.v, value)):
            m = t.detach().abs().float().amax(dim=(0, 2, 3))  # (B, H_kv, S, D) -> [H_kv]
            store[name] = m if name not in store else torch.maximum(store[name], m)


def install(observer: KVObserver) -> str:
    """Register the observing attention function; returns its attn_implementation name."""
    from transformers import AttentionInterface  # lazy: transformers (~2 s to import); only when a model is built
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def observing(module, query, key, value, attention_mask, **kwargs):
        observer.record(module, key, value)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(OBSERVER, observing)
    return OBSERVER
