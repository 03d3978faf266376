"""Observe the attention's keys and values as the KV cache stores them.

Attention modules are found by what they do, not by a forward argument's
name (transformers 5 renamed `past_key_value`, and compressed-tensors' KV
calibration silently skips attention because of it): transformers 5 routes
every attention call through `AttentionInterface`, handing the function the
module and the key/value states *after* RoPE and q/k norms, shaped
(batch, kv_heads, seq, head_dim) — exactly what the engine writes into its
cache. We register an observing wrapper around the model's own attention
function (SDPA, or the architecture's eager one: GPT-OSS's sinks) and select it
with `attn_implementation`.

MLA layers (DeepSeek-V3, Kimi K2; tfcompile/families/attention.py) cache the
latent c_kv and the RoPE key k_pe, not per-head K/V: for them the observer wraps
the module's `expand_kv` (which receives exactly the cached pair) and records
max(|c_kv|, |k_pe|) as one amax for the whole entry: engines quantize the entry
with one `k_scale` (vLLM `concat_and_cache_mla(kv_c, k_pe, ..., scale=k_scale)`),
and `v_scale` carries the same value.
"""

from __future__ import annotations

from typing import Any

import torch

from tfcompile.families.attention import is_mla, register_wrapper

OBSERVER = "tfcompile_kv_observer"


class KVObserver:
    """Per attention module: max |K| and max |V|, per KV head (float32 [kv_heads]); for MLA one
    amax [1] of the cached latent + RoPE key, in both k and v."""

    def __init__(self, model: torch.nn.Module):
        self._names = {id(m): n for n, m in model.named_modules()}
        self.k: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        self._mla = {n: m for n, m in model.named_modules() if is_mla(m)}
        self._paused = False  # Recorders.paused()
        for name, mod in self._mla.items():
            mod.expand_kv = self._observing_expand(name, mod.expand_kv)  # instance attribute: remove() drops it

    def _observing_expand(self, name: str, expand):
        def observe(kv_nope: torch.Tensor, k_rot: torch.Tensor):
            if self._paused:
                return expand(kv_nope, k_rot)
            m = torch.maximum(kv_nope.detach().abs().amax().float(), k_rot.detach().abs().amax().float()).reshape(1)
            for store in (self.k, self.v):
                store[name] = m if name not in store else torch.maximum(store[name], m)
            return expand(kv_nope, k_rot)

        return observe

    def remove(self) -> None:
        for mod in self._mla.values():
            mod.__dict__.pop("expand_kv", None)

    def record(self, module: Any, key: torch.Tensor, value: torch.Tensor) -> None:
        name = self._names.get(id(module))
        if name is None or name in self._mla or self._paused:  # MLA: recorded from the cached latent (expand_kv)
            return
        for store, t in ((self.k, key), (self.v, value)):
            m = t.detach().abs().float().amax(dim=(0, 2, 3))  # (B, H_kv, S, D) -> [H_kv]
            store[name] = m if name not in store else torch.maximum(store[name], m)


def install(observer: KVObserver, model: torch.nn.Module) -> str:
    """Register the observing attention function around `model`'s own; returns its name."""
    def make(base):
        def observing(module, query, key, value, attention_mask, **kwargs):
            observer.record(module, key, value)
            return base(module, query, key, value, attention_mask, **kwargs)

        return observing

    return register_wrapper(OBSERVER, model, make)
