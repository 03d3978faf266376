"""The EAGLE-3 draft head, in plain torch, with the parameter names of `speculators`' Eagle3DraftModel.

One decoder layer (Llama layout) whose q/k/v projections read `cat(norm(embed(x)), norm(h))`
(2H wide), where h is either the target's low/middle/high hidden states fused by `fc`
(3H -> H) or, further down a chain, the draft's own previous output. Its output goes
through `norm` and `lm_head` (H -> draft vocabulary); `d2t` maps a draft id back to a
target id (target = draft + d2t[draft]), `t2d` marks the target ids the draft vocabulary
keeps (speculators' and vLLM's convention; both absent when the vocabularies are equal).

Alignment (speculators' `shift_batch`): draft index i reads the token x[i+1], the target's
hidden states g[i] (of position i) at position id i+1, and predicts x[i+2]. Chain step j
(EAGLE-3's "training-time test") at index i reads x[i+1+j] and the draft's output of step
j-1 at index i, at position id i+1+j, and predicts x[i+2+j]. Attention at step j: the step-0
keys of indices <= i and the keys of steps 1..j at index i itself (the draft's own chain),
exactly what a chain of drafts sees at decode time (DraftState below), so training and
decoding run one function.

Everything runs in float32; shapes use B (batch), T (indices), H (hidden), V / Vd (target /
draft vocabulary), n_h / n_kv heads of d = head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DraftShape:
    hidden: int  # H, = the target's hidden size (vLLM requires it)
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int  # V, the target's vocabulary
    draft_vocab: int  # Vd <= V
    rms_eps: float
    rope_theta: float
    aux_layers: tuple[int, ...]  # the target's hidden_states indices fused by fc (HF: i = input of layer i)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Attn(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(2 * s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)


class _MLP(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.rms_eps)  # on the token embeddings
        self.hidden_norm = RMSNorm(s.hidden, s.rms_eps)  # on the fused / previous hidden state
        self.self_attn = _Attn(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.rms_eps)
        self.mlp = _MLP(s)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding (rotate-half layout) of x [B, heads, T, d] at positions pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))  # [d/2]
    ang = pos.to(torch.float32)[:, None] * inv[None, :]  # [T, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()  # [T, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3Draft(nn.Module):
    """Parameters named as speculators' Eagle3DraftModel saves them (state_dict keys)."""

    def __init__(self, s: DraftShape):
        super().__init__()
        self.s = s
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)  # the target's, frozen
        self.fc = nn.Linear(len(s.aux_layers) * s.hidden, s.hidden, bias=False)
        self.layers = nn.ModuleList([_Layer(s)])
        self.norm = RMSNorm(s.hidden, s.rms_eps)
        self.lm_head = nn.Linear(s.hidden, s.draft_vocab, bias=False)  # target's rows, frozen
        if s.draft_vocab != s.vocab:
            self.register_buffer("d2t", torch.zeros(s.draft_vocab, dtype=torch.int64))  # target - draft id
            self.register_buffer("t2d", torch.zeros(s.vocab, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None

    def trainable(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of what training updates: fc, the layer, the final norm."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith(("embed_tokens", "lm_head"))]

    def step(self, tokens: torch.Tensor, h: torch.Tensor, pos: torch.Tensor, past: list,
             mask: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One pass of the decoder layer.

        tokens [B, T] ids, h [B, T, H] (fused target state or previous draft output), pos [T]
        position ids, past: [(K, V)] earlier keys/values [B, n_kv, S_i, d] (after RoPE), mask
        [T, sum S_i + T] bool (True = attend). Returns (output hidden [B, T, H], this pass's (K, V))."""
        s, lay = self.s, self.layers[0]
        a = lay.self_attn
        x = torch.cat([lay.input_layernorm(self.embed_tokens(tokens)), lay.hidden_norm(h)], -1)  # [B, T, 2H]
        B, T, _ = x.shape
        q = a.q_proj(x).view(B, T, s.heads, s.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = rope(q, pos, s.rope_theta), rope(k, pos, s.rope_theta)
        keys = torch.cat([*(kv[0] for kv in past), k], 2)
        vals = torch.cat([*(kv[1] for kv in past), v], 2)
        rep = s.heads // s.kv_heads  # grouped-query attention: each KV head serves `rep` query heads
        keys, vals = keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1)
        att = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)  # [B, n_h, T, d]
        out = h + a.o_proj(att.transpose(1, 2).reshape(B, T, s.heads * s.head_dim))
        out = out + lay.mlp(lay.post_attention_layernorm(out))
        return out, (k, v)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] of output hidden states h [..., H]."""
        return self.lm_head(self.norm(h))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def ttt(self, tokens: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test over whole sequences: draft logits [B, T-1, Vd] per chain step.

        tokens [B, T] the sequence, aux [B, T, 3H] the target's hidden states at every position.
        Step j's row i predicts tokens[i+2+j]; inputs past the end are padded with id 0 (their
        rows are masked out of the loss by the caller)."""
        B, T = tokens.shape
        n = T - 1  # draft indices 0..T-2
        dev = tokens.device
        h = self.fc(aux[:, :n])  # g[i]
        pos0 = torch.arange(1, n + 1, device=dev)
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        diag = torch.eye(n, dtype=torch.bool, device=dev)
        past, out = [], []
        for j in range(steps):
            x = torch.cat([tokens[:, 1 + j:], tokens.new_zeros(B, j)], 1)  # x[i+1+j], padded
            mask = torch.cat([causal] + [diag] * j, 1)  # [n, (j+1) n]
            h, kv = self.step(x, h, pos0 + j, past, mask)
            past.append(kv)
            out.append(self.logits(h))
        return out


class DraftState:
    """A draft's decode-time state: step-0 keys/values of the verified sequence, filled lazily.

    The target hands over its fused hidden states for each position it verifies (`extend`);
    `propose` computes step-0 entries for every index whose token x[i+1] is known, then chains
    k-1 more steps from the last one (the masks of Eagle3Draft.ttt, for one row)."""

    def __init__(self, draft: Eagle3Draft):
        self.d = draft
        self.g: list[torch.Tensor] = []  # fc inputs [3H] per verified position
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None  # step-0 cache [1, n_kv, c, d]
        self.logits: list[torch.Tensor] = []  # the last proposal's draft logits [Vd] per chain step

    def extend(self, aux: torch.Tensor) -> None:
        """aux [n, 3H]: the target's hidden states of the next n verified positions."""
        self.g.extend(aux.to(torch.float32).unbind(0))

    @torch.no_grad()
    def propose(self, seq: list[int], k: int) -> list[int]:
        """k target-vocabulary token ids following seq (whose last token is not verified yet)."""
        if k <= 0:
            return []
        dev = self.d.fc.weight.device
        c = 0 if self.kv is None else self.kv[0].shape[2]
        n = len(seq)  # indices with a known next token: 0..n-2 (g known for them)
        idx = torch.arange(c, n - 1, device=dev)
        toks = torch.tensor([seq[c + 1:n]], device=dev)
        h = self.d.fc(torch.stack(self.g[c:n - 1]).to(dev).view(1, len(idx), -1))
        past = [] if self.kv is None else [self.kv]
        mask = torch.cat([torch.ones(len(idx), c, dtype=torch.bool, device=dev),
                          torch.ones(len(idx), len(idx), dtype=torch.bool, device=dev).tril()], 1)
        out, kv = self.d.step(toks, h, idx + 1, past, mask)
        self.kv = kv if self.kv is None else (torch.cat([self.kv[0], kv[0]], 2), torch.cat([self.kv[1], kv[1]], 2))
        h = out[:, -1:]  # the row of index n-2
        chain, drafted = [self.kv], []
        self.logits = []
        for j in range(k):
            self.logits.append(self.d.logits(h[0, 0]))
            tok = int(self.d.to_target(self.logits[-1].argmax()))
            drafted.append(tok)
            if j + 1 == k:
                break
            pos = torch.tensor([n - 1 + j + 1], device=dev)  # position id of index n-2 at step j+1
            mask = torch.ones(1, n - 1 + j + 1, dtype=torch.bool, device=dev)  # step-0 keys <= n-2, chain
            h, kvj = self.d.step(torch.tensor([[tok]], device=dev), h, pos, chain, mask)
            chain.append(kvj)
        return drafted
