"""A reference decoder that runs an artifact view the way an engine would: per TP shard, over a
paged KV cache. The check that the layout transforms preserve the model (tests/layout).

`load_view(artifact, view)` reads the compressed-tensors view (view=None) or an engine view
(OUT/<target>/, with its layout.json), dequantizes every quantized Linear
(tfcompile.kernels.formats, exactly as `tfcompile eval` does) and returns a `View`.
`Decoder(view, kv).logits(tokens, chunks)` runs Llama / Qwen3 / Qwen3-MoE style
decoders (RMSNorm, RoPE default type, GQA, SiLU-gated MLP, optional q/k norms, top-k
MoE) in this order for every layer and TP shard r:

  q_r, k_r, v_r = rows of shard r of qkv_proj (layout.json spans) or of q/k/v_proj
  q/k norms per head, RoPE in the view's convention (half-split or interleaved)
  K, V -> the shard's PagedKV (NHD/HND pages, block table, bf16/FP8/NVFP4, scales)
  o_r  = paged_attention(q_r) @ o_proj[:, shard r's query-head columns].T
  out  = sum_r o_r  (the all-reduce), MLP likewise on shard r's gate/up rows

so a wrong head grouping, row order, replication or page index changes the logits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from tfcompile.artifact.manifest import load_manifest
from tfcompile.artifact.naming import ct_outputs, qtensor_of
from tfcompile.dist.devices import one_torch_thread
from tfcompile.kernels.formats import dequantize
from tfcompile.layout.paged_attention import KVFormat, PagedKV, paged_attention
from tfcompile.schemes import KV_BY_DTYPE, get_scheme


@dataclass
class View:
    config: dict  # the view's config.json (text part)
    weights: dict[str, torch.Tensor]  # float32, quantized Linears dequantized to `<module>.weight`
    layout: dict = field(default_factory=dict)  # layout.json ({} for the compressed-tensors view)

    @property
    def tp(self) -> int:
        return int(self.layout.get("tp", 1))

    @property
    def rope(self) -> str:
        return self.layout.get("rope", {}).get("view", "half")


class _Tensors:
    def __init__(self, d: Path):
        self.t = {}
        for f in sorted(d.glob("*.safetensors")):
            with safe_open(f, framework="pt") as h:
                self.t.update({k: h.get_tensor(k) for k in h.keys()})

    def get(self, name: str) -> torch.Tensor:
        return self.t[name]


def load_view(artifact: Path, view: str | None = None) -> View:
    """The compressed-tensors view (None) or engine view `view` of a tfcompile artifact, dequantized."""
    artifact = Path(artifact)
    manifest = load_manifest(artifact)
    scheme = get_scheme(manifest["scheme"]["name"])
    d = artifact / view if view else artifact
    layout = json.loads((d / "layout.json").read_text()) if view else {}
    linears = ({m: tuple(x["shape"]) for m, x in layout["linears"].items()} if view
               else {x["module"]: tuple(x["shape"]) for x in manifest["layers"]})
    src = _Tensors(d)
    weights, used = {}, set()
    for m, (n, k) in linears.items():
        weights[f"{m}.weight"] = dequantize(qtensor_of(src, scheme, m, n, k), torch.float32)
        used |= {s.name for s in ct_outputs(scheme, m, n, k, torch.bfloat16)}
    weights.update({n: t.float() for n, t in src.t.items() if n not in used})
    cfg = json.loads((d / "config.json").read_text())
    return View(cfg.get("text_config", cfg), weights, layout)


@dataclass(frozen=True)
class KVSpec:
    """The KV cache to run with (from OUT/tfcompile/kv_cache.json, or given)."""
    layout: str = "NHD"
    block_size: int = 16
    head_dim_padded: int = 0  # 0 = head_dim
    dtype: str = "fp32"  # fp32 | bf16 | fp16 | fp8_e4m3 | nvfp4
    scales: str = "artifact"  # fp8/nvfp4: "artifact" (k_scale/v_scale) | "max over heads" (FlashInfer)

    @staticmethod
    def from_descriptor(doc: dict, **over) -> "KVSpec":
        collapse = (doc.get("scales") or {}).get("engine_reads") == "max over heads"
        base = dict(layout=doc["layout"], block_size=doc["block_size"], head_dim_padded=doc["head_dim_padded"],
                    dtype=doc["dtype"], scales="max over heads" if collapse else "artifact")
        return KVSpec(**{**base, **over})


class Decoder:
    def __init__(self, view: View, kv: KVSpec = KVSpec(), dtype: torch.dtype = torch.float32,
                 num_blocks: int = 64):
        self.v, self.kv, self.dtype, self.num_blocks = view, kv, dtype, num_blocks
        c = view.config
        self.heads, self.kv_heads = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
        self.d = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"reference decoder: rope_type {rope.get('rope_type')} is not implemented")
        theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        self.rot = int(self.d * float(c.get("partial_rotary_factor") or 1.0))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.rot, 2, dtype=torch.float32) / self.rot))
        self.caches: dict = {}

    def w(self, name: str) -> torch.Tensor:
        return self.v.weights[name].to(self.dtype)

    # -- building blocks ---------------------------------------------------------------------
    def norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        """RMSNorm as transformers computes it: float32 statistics, weight in the compute dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.w(weight) * h.to(self.dtype)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D]; pairs (i, i + R/2) half-split, (2i, 2i+1) interleaved."""
        ang = pos.float()[:, None] * self.inv_freq[None]  # [T, R/2]
        cos, sin = ang.cos().to(x.dtype)[:, None], ang.sin().to(x.dtype)[:, None]
        r, half = self.rot, self.rot // 2
        xr = x[..., :r]
        if self.v.rope == "interleaved":
            a, b = xr[..., 0::2], xr[..., 1::2]
            out = torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)
        else:
            a, b = xr[..., :half], xr[..., half:]
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), -1)
        return torch.cat((out, x[..., r:]), -1)

    def cache(self, layer: int, shard: int, kind: str, kv_heads: int) -> PagedKV:
        key = (layer, shard, kind)
        if key not in self.caches:
            fmt = KVFormat(self.kv.layout, self.kv.block_size, self.d, self.kv.head_dim_padded or self.d,
                           self.kv.dtype)
            scale = self._kv_scale(layer, shard, kind, kv_heads) if self.kv.dtype in KV_BY_DTYPE else None
            self.caches[key] = PagedKV(fmt, kv_heads, self.num_blocks, scale=scale, seed=layer * 31 + shard)
        return self.caches[key]

    def _kv_scale(self, layer: int, shard: int, kind: str, kv_heads: int) -> torch.Tensor:
        s = self.v.weights[f"model.layers.{layer}.self_attn.{kind}_scale"].float().reshape(-1)
        if self.kv.scales == "max over heads" or s.numel() == 1:
            return s.max().reshape(1)
        return s[shard * kv_heads:(shard + 1) * kv_heads]

    # -- layers ------------------------------------------------------------------------------
    def rows(self, module: str, proj: str, shard: int, per_shard: int) -> torch.Tensor:
        """Shard `shard`'s rows of projection `proj` (from a fused view Linear when there is one)."""
        parent = module.rpartition(".")[0]
        fused = next((f for f in (f"{parent}.qkv_proj", f"{parent}.gate_up_proj") if f"{f}.weight" in self.v.weights
                      and proj in [s[0] for s in self.v.layout["linears"][f]["shards"][shard]]), None)
        if fused is not None:
            span = next(s for s in self.v.layout["linears"][fused]["shards"][shard] if s[0] == proj)
            return self.w(f"{fused}.weight")[span[1]:span[2]]
        w = self.w(f"{parent}.{proj}.weight")
        return w[shard * per_shard:(shard + 1) * per_shard]

    def attention(self, i: int, x: torch.Tensor, pos: torch.Tensor, seq: int) -> torch.Tensor:
        p, tp, d = f"model.layers.{i}.self_attn", self.v.tp, self.d
        qh, kh = self.heads // tp, self.kv_heads // tp
        out = 0
        for r in range(tp):
            q = (x @ self.rows(f"{p}.q_proj", "q_proj", r, qh * d).T).view(-1, qh, d)
            k = (x @ self.rows(f"{p}.k_proj", "k_proj", r, kh * d).T).view(-1, kh, d)
            v = (x @ self.rows(f"{p}.v_proj", "v_proj", r, kh * d).T).view(-1, kh, d)
            if f"{p}.q_norm.weight" in self.v.weights:
                q, k = self.norm(q, f"{p}.q_norm.weight"), self.norm(k, f"{p}.k_norm.weight")
            q, k = self.rope(q, pos), self.rope(k, pos)
            kc, vc = self.cache(i, r, "k", kh), self.cache(i, r, "v", kh)
            kc.append(seq, k), vc.append(seq, v)
            a = paged_attention(q, kc, vc, seq, pos).to(self.dtype).reshape(-1, qh * d)
            out = out + a @ self.w(f"{p}.o_proj.weight")[:, r * qh * d:(r + 1) * qh * d].T
        return out

    def mlp(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        """SiLU-gated MLP `prefix` (dense, or one expert), summed over TP shards."""
        tp = self.v.tp
        n = self._rows_of(prefix)
        out = 0
        for r in range(tp):
            g = x @ self.rows(f"{prefix}.gate_proj", "gate_proj", r, n // tp).T
            u = x @ self.rows(f"{prefix}.up_proj", "up_proj", r, n // tp).T
            h = torch.nn.functional.silu(g) * u
            out = out + h @ self.w(f"{prefix}.down_proj.weight")[:, r * (n // tp):(r + 1) * (n // tp)].T
        return out

    def _rows_of(self, prefix: str) -> int:
        return self.v.weights[f"{prefix}.down_proj.weight"].shape[1]

    def moe(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        """Qwen3-MoE / Mixtral routing: softmax over experts, top-k, renormalised if norm_topk_prob."""
        c = self.v.config
        probs = torch.softmax((x @ self.w(f"{prefix}.gate.weight").T).float(), dim=-1)
        top, idx = torch.topk(probs, c["num_experts_per_tok"], dim=-1)
        if c.get("norm_topk_prob", False):
            top = top / top.sum(-1, keepdim=True)
        top = top.to(self.dtype)
        out = torch.zeros_like(x)
        for e in idx.unique().tolist():
            rows, slot = (idx == e).nonzero(as_tuple=True)
            out[rows] += self.mlp(f"{prefix}.experts.{e}", x[rows]) * top[rows, slot, None]
        return out

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, seq: int) -> torch.Tensor:
        x = self.w("model.embed_tokens.weight")[tokens]
        for i in range(self.v.config["num_hidden_layers"]):
            p = f"model.layers.{i}"
            x = x + self.attention(i, self.norm(x, f"{p}.input_layernorm.weight"), pos, seq)
            h = self.norm(x, f"{p}.post_attention_layernorm.weight")
            x = x + (self.moe(f"{p}.mlp", h) if f"{p}.mlp.gate.weight" in self.v.weights else self.mlp(f"{p}.mlp", h))
        head = "lm_head.weight" if "lm_head.weight" in self.v.weights else "model.embed_tokens.weight"
        return (self.norm(x, "model.norm.weight") @ self.w(head).T).float()

    def logits(self, tokens: torch.Tensor, chunks: list[int] | None = None, seq: int = 0) -> torch.Tensor:
        """tokens [T] -> logits [T, vocab]: prefill `chunks[0]` tokens, then the next chunks (decode
        steps of 1 by default), each reading what the earlier ones cached."""
        chunks = chunks or [tokens.numel()]
        if sum(chunks) < tokens.numel():
            chunks = chunks + [1] * (tokens.numel() - sum(chunks))
        out, at = [], 0
        # One intra-op thread: the tensors are tiny, and an OpenMP team spinning on a busy 2-core
        # box made each small einsum ~1000x slower (27 ms vs 18 us, measured).
        with one_torch_thread(), torch.no_grad():
            for n in chunks:
                pos = torch.arange(at, at + n)
                out.append(self.forward(tokens[at:at + n], pos, seq))
                at += n
        return torch.cat(out)


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|: the logit differences reported by tests/layout."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


__all__ = ["View", "KVSpec", "Decoder", "load_view", "max_rel"]
