"""A reference MLA (DeepSeek-V3 latent attention) layer over a paged cache laid out as kv_cache.json says.

The cache holds, per token, one entry of `entry_dim` = kv_lora_rank + qk_rope_head_dim
values: the latent c_kv (after kv_a_layernorm) then the RoPE key k_pe (after RoPE), one
"head", encoded with the layer's single k_scale when FP8 (tfcompile/layout/variants.py).
K and V are expanded from the read-back entries by kv_b_proj, as an engine's prefill path
does (its decode path absorbs kv_b_proj into q and o instead: the same product, reordered).
Paging, block tables and the FP8 / NVFP4 encodings are the reference PagedKV's
(tfcompile/layout/paged_attention.py), so a wrong entry layout, split or scale changes the
output. tests/families/test_attention_variants.py compares it with transformers'
DeepseekV3Attention (FP8 emulated as `tfcompile eval` does).
"""

from __future__ import annotations

import torch

from tfcompile.layout.paged_attention import KVFormat, PagedKV


def mla_reference(attn, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, dtype: str = "fp32",
                  k_scale: torch.Tensor | None = None, layout: str = "NHD", block: int = 16) -> torch.Tensor:
    """hidden [T, hidden] of one sequence at positions 0..T-1 -> attention output [T, hidden] (float32).

    `attn` is a transformers DeepseekV3Attention (its weights and RoPE convention are read);
    cos/sin are the model's rotary tables for those positions ([T, rope_dim])."""
    # lazy: transformers (~2 s to import); only when a model is built
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (apply_rotary_pos_emb,
                                                                      apply_rotary_pos_emb_interleave)

    t, h = hidden.shape[0], attn.num_heads
    nope, rope, r, vdim = attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.kv_lora_rank, attn.v_head_dim
    x = hidden.float()
    with torch.no_grad():
        lin = (lambda m, y: y @ m.weight.float().T + (m.bias.float() if m.bias is not None else 0))
        q = lin(attn.q_b_proj, attn.q_a_layernorm(lin(attn.q_a_proj, x))).view(t, h, nope + rope)
        kv = lin(attn.kv_a_proj_with_mqa, x)
        latent, k_rot = attn.kv_a_layernorm(kv[:, :r]), kv[:, r:]
        rot = apply_rotary_pos_emb_interleave if attn.config.rope_interleave else apply_rotary_pos_emb
        q_rot, k_rot = rot(q[None, :, :, nope:].transpose(1, 2), k_rot[None, None], cos[None], sin[None])
        q = torch.cat([q[:, :, :nope], q_rot[0].transpose(0, 1)], dim=-1)  # [T, H, nope + rope]
        entry = torch.cat([latent, k_rot[0, 0]], dim=-1)[:, None, :]  # [T, 1, r + rope]: the cached entry
        cache = PagedKV(KVFormat(layout, block, r + rope, r + rope, dtype), 1, -(-t // block) + 2,
                        scale=k_scale, seed=7)
        cache.append(0, entry)
        stored = cache.read(0)[:, 0]  # [S, r + rope] as the engine reads it back
        kvb = (stored[:, :r] @ attn.kv_b_proj.weight.float().T).view(-1, h, nope + vdim)
        k = torch.cat([kvb[..., :nope], stored[:, None, r:].expand(-1, h, rope)], dim=-1)
        v = kvb[..., nope:]
        scores = torch.einsum("thd,shd->hts", q, k) * attn.scaling
        causal = torch.arange(k.shape[0])[None, :] <= torch.arange(t)[:, None]
        probs = torch.softmax(scores.masked_fill(~causal[None], float("-inf")), dim=-1)
        out = torch.einsum("hts,shd->thd", probs, v).reshape(t, h * vdim)
        return lin(attn.o_proj, out)
