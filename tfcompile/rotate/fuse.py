"""Rotations fused into the weights (QuaRot / SpinQuant R1 and R2): the model computes the same
function, its Linears see rotated inputs and weights, and nothing runs online.

R1, the residual stream. Every block reads the residual h through an RMSNorm and writes back
into it through o_proj and down_proj. With Q orthogonal [H, H] and the residual kept as h Q:
    rms(h Q) = rms(h)                         (a rotation keeps the norm)
so an RMSNorm *without* its weight commutes with Q. Each norm weight g is therefore first
folded into the Linears it feeds (W -> W diag(g), g -> 1), then:
    embeddings         E -> E Q                       [V, H]
    q/k/v, gate/up     W -> W diag(g) Q               [N, H]: reads h Q
    o_proj, down_proj  W -> Q^T W (bias b -> b Q)     [H, K]: writes into h Q
    lm_head            W -> W diag(g_final) Q         reads the final norm of h Q
A tied lm_head (SmolLM2, Llama 3.2 1B/3B) cannot stay tied: the embedding needs E Q and the head
E diag(g_final) Q. The rotated checkpoint unties them (config.json tie_word_embeddings false,
an lm_head.weight of its own: vocab x hidden more bf16 bytes, 56 MB for SmolLM2) and says so.

R2, per attention head (`heads`): with R [d, d] orthogonal (d = head_dim), every KV head's
value rows become R^T W_v[head] (so V_head -> V_head R, the KV cache stores rotated values) and
every query head's o_proj columns W_o[:, head] R; attention weights mix positions, not
channels, so the rotation passes through softmax(QK^T) V unchanged and cancels in o_proj.

Kept channels. A real LLM's residual stream carries "massive activations": a few channels
hundreds to thousands of times larger than the rest on a few tokens (the first token, the
attention sink). The norms that read such a channel often all but switch it off (|g_j| ~ 0), so
the unrotated model's Linears see g_j x_j ~ 0 there, and a weight's quantization error in column
j is multiplied by g_j ~ 0 too. Rotated, the folded weight W diag(g) Q is quantized and its
input x Q carries the whole massive component spread over every channel: the quantization
error of every column meets it (SmolLM2-135M: on the first token the up/gate/v projections
lose 12-17 dB of output SQNR; docs/accuracy.md "SmolLM2-135M-Instruct: why rotations hurt"). R1 therefore
leaves such channels out (`rotation_keeping`: identity on them, the rotation on the rest);
`suppressed_channels` finds them from the norm weights alone. Every identity above still
holds: Q stays orthogonal.

Architectures: plain RMSNorm Llama-style decoders (model_type llama, mistral, qwen2, qwen3):
norms y = x / rms(x) * g with no bias and no (1 + g) offset, separate q/k/v and gate/up Linears.
Anything else is refused before any work (`check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tfcompile.families.dense import DENSE_MODEL_TYPES

SUPPORTED = DENSE_MODEL_TYPES  # the plain dense decoders (tfcompile/families/dense.py)
ATTN_IN = ("q_proj", "k_proj", "v_proj")
MLP_IN = ("gate_proj", "up_proj")
RESIDUAL_NORMS = ("input_layernorm", "post_attention_layernorm")  # the norms that read the residual


@dataclass(frozen=True)
class Rotations:
    r1: torch.Tensor  # [H, H] float64, orthogonal
    r2: torch.Tensor | None  # [d, d] float64 (per head), or None
    kv_heads: int
    heads: int
    head_dim: int


def text_config(config: dict) -> dict:
    return config.get("text_config") if isinstance(config.get("text_config"), dict) else config


def check(config: dict, names: set[str]) -> str | None:
    """None when the checkpoint is a decoder these rules rotate exactly, else the reason."""
    cfg = text_config(config)
    if cfg.get("model_type") not in SUPPORTED:
        return (f"model_type {cfg.get('model_type')!r} is not one of {', '.join(SUPPORTED)} "
                "(plain RMSNorm decoders with separate q/k/v and gate/up Linears)")
    layers = int(cfg.get("num_hidden_layers") or 0)
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(layers):
        p = f"model.layers.{i}."
        need += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        need += [f"{p}self_attn.{m}.weight" for m in ATTN_IN + ("o_proj",)]
        need += [f"{p}mlp.{m}.weight" for m in MLP_IN + ("down_proj",)]
    missing = [n for n in need if n not in names]
    if missing or not layers:
        return f"tensor {missing[0] if missing else 'model.layers.*'} is missing (not a Llama-style layout)"
    biased = [n for n in names if "norm" in n and n.endswith(".bias")]
    if biased:
        return f"{biased[0]}: a norm with a bias (LayerNorm) is not rotation-invariant"
    return None


def suppressed_channels(get: Callable[[str], torch.Tensor], layers: int, threshold: float) -> tuple[int, ...]:
    """Residual channels some residual-reading norm (a layer's input or post-attention norm, the
    final norm) weighs below `threshold` x its median |g|: the channels the model switches off
    (where its massive activations live), which R1 leaves unrotated. Sorted, no duplicates."""
    names = [f"model.layers.{i}.{n}.weight" for i in range(layers) for n in RESIDUAL_NORMS] + ["model.norm.weight"]
    found: set[int] = set()
    for name in names:
        g = get(name).float().abs()
        found.update((g < threshold * g.median()).nonzero().flatten().tolist())
    return tuple(sorted(found))


def rotated(name: str, get: Callable[[str], torch.Tensor], rot: Rotations) -> torch.Tensor:
    """The rotated value of tensor `name` (float32; the caller casts to the stored dtype)."""
    q = rot.r1.float()
    w = get(name).float()
    parts = name.split(".")
    if name == "model.embed_tokens.weight":
        return w @ q
    if name == "lm_head.weight":  # tied: `get` serves the embedding under this name
        return (w * get("model.norm.weight").float()[None, :]) @ q
    if name in ("model.norm.weight",) or parts[-2] in RESIDUAL_NORMS and parts[-1] == "weight":
        return torch.ones_like(w)  # folded into the Linears that read it (q_norm/k_norm are not)
    if len(parts) < 6 or parts[1] != "layers":
        return w
    prefix, proj, kind = ".".join(parts[:3]), parts[4], parts[5]
    if proj in ATTN_IN + MLP_IN and kind == "weight":
        norm = "input_layernorm" if proj in ATTN_IN else "post_attention_layernorm"
        w = (w * get(f"{prefix}.{norm}.weight").float()[None, :]) @ q
        return _r2_rows(w, rot) if proj == "v_proj" and rot.r2 is not None else w
    if proj == "v_proj" and kind == "bias" and rot.r2 is not None:
        return _r2_rows(w[:, None], rot)[:, 0]
    if proj in ("o_proj", "down_proj"):
        if proj == "o_proj" and kind == "weight" and rot.r2 is not None:
            w = _r2_cols(w, rot)
        return q.T @ w if kind == "weight" else w @ q
    return w


def _r2_rows(w: torch.Tensor, rot: Rotations) -> torch.Tensor:
    """v_proj rows [kv_heads * d, K]: each head's block -> R^T block."""
    d = rot.head_dim
    blocks = w.reshape(rot.kv_heads, d, -1)
    return (rot.r2.float().T @ blocks).reshape(w.shape)


def _r2_cols(w: torch.Tensor, rot: Rotations) -> torch.Tensor:
    """o_proj columns [H, heads * d]: each head's block -> block R."""
    d = rot.head_dim
    blocks = w.reshape(w.shape[0], rot.heads, d)
    return (blocks @ rot.r2.float()).reshape(w.shape)
