"""Attention head geometry and the row maps of the layout transforms.

Every weight transform of the layout pass is a *row gather* of a projection
[N, K] (out_features, in_features): view row i takes source row `rows[i]`.
Quantization scales run along K (per row, per 16/32-element block of a row,
per tensor), so gathering rows before quantization gives the same codes and
scales as gathering the quantized rows (tests/layout/test_heads.py); only
FP8 128x128 blocks mix rows, and those are computed on the view's own rows.

RoPE (half-split vs interleaved). In a head of D rows, the first R (rotary
dim) are rotated in pairs with frequency i = 0..R/2-1:
  half-split (HF `rotate_half`, GPT-NeoX): pair (i, i + R/2)
  interleaved (GPT-J, Meta's original Llama, llama.cpp "norm"): pair (2i, 2i+1)
So interleaved row 2i takes half-split row i and row 2i+1 takes row i + R/2
(the inverse of `permute` in transformers' convert_llama_weights_to_hf.py).
q and k get the same order, so q.k per head is unchanged; v and o_proj do not
change (attention's output columns follow v's rows, not q's).

Tensor parallelism (GQA). Engines shard attention by heads: shard r of T gets
query heads [r*H/T, (r+1)*H/T) and the KV heads those read. Query heads stay
in their natural order (o_proj's input columns therefore too). When T > the
KV head count each KV head is replicated T/KV times so every shard owns one
(vLLM's `num_kv_head_replicas`); the view then has T KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tfcompile.errors import RecipeError

ROPE_STYLES = ("half", "interleaved")


@dataclass(frozen=True)
class HeadGeometry:
    heads: int  # query heads H (num_attention_heads)
    kv_heads: int  # KV heads (num_key_value_heads; = H without GQA)
    head_dim: int  # D, rows per head in q/k/v_proj
    rotary_dim: int  # R <= D: leading rows of a head that RoPE rotates (partial_rotary_factor)

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> "HeadGeometry | None":
        """From config.json (text_config for multimodal wrappers); None without attention heads."""
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        heads = text.get("num_attention_heads")
        hidden = text.get("hidden_size")
        if not heads or not hidden:
            return None
        kv = text.get("num_key_value_heads") or heads
        d = text.get("head_dim") or hidden // heads
        rot = int(d * float(text.get("partial_rotary_factor") or 1.0))
        return HeadGeometry(int(heads), int(kv), int(d), rot - rot % 2)


def rope_order(geom: HeadGeometry, src: str, dst: str) -> tuple[int, ...] | None:
    """Within-head row order (view row d <- source row order[d]); None when src == dst."""
    for s in (src, dst):
        if s not in ROPE_STYLES:
            raise RecipeError(f"layout.rope {s!r} is not one of {', '.join(ROPE_STYLES)}",
                              hint="--set layout.rope=half or --set layout.rope=interleaved")
    if src == dst:
        return None
    r, half = geom.rotary_dim, geom.rotary_dim // 2
    to_inter = [d // 2 + (d % 2) * half for d in range(r)]  # half-split -> interleaved
    order = to_inter if src == "half" else [to_inter.index(d) for d in range(r)]
    return tuple(order + list(range(r, geom.head_dim)))  # rows past the rotary dim stay


@dataclass(frozen=True)
class HeadPlan:
    """Which source rows each TP shard's q/k/v rows come from, in view order."""
    geom: HeadGeometry
    tp: int
    kv_map: tuple[int, ...]  # view KV head j <- source KV head kv_map[j] (repeats = replicas)
    order: tuple[int, ...] | None  # within-head row order of q and k (RoPE); None = unchanged

    @property
    def q_per_shard(self) -> int:
        return self.geom.heads // self.tp

    @property
    def view_kv_heads(self) -> int:
        return len(self.kv_map)

    @property
    def kv_per_shard(self) -> int:
        return self.view_kv_heads // self.tp

    @property
    def replicas(self) -> int:
        return self.view_kv_heads // self.geom.kv_heads

    def _head_rows(self, head: int, rope: bool) -> list[int]:
        d = self.geom.head_dim
        within = self.order if (rope and self.order is not None) else range(d)
        return [head * d + i for i in within]

    def rows(self, proj: str, shard: int) -> list[int]:
        """Source rows of `proj` ("q", "k" or "v") for `shard`, in view order."""
        if proj == "q":
            heads = range(shard * self.q_per_shard, (shard + 1) * self.q_per_shard)
            return [i for h in heads for i in self._head_rows(h, True)]
        kv = self.kv_map[shard * self.kv_per_shard:(shard + 1) * self.kv_per_shard]
        return [i for h in kv for i in self._head_rows(h, proj == "k")]

    def all_rows(self, proj: str) -> list[int]:
        return [i for r in range(self.tp) for i in self.rows(proj, r)]

    def changes(self, proj: str) -> bool:
        """Whether `proj`'s view rows differ from the source's (else it is copied as is)."""
        n = (self.geom.heads if proj == "q" else self.geom.kv_heads) * self.geom.head_dim
        return self.all_rows(proj) != list(range(n))


def plan_heads(geom: HeadGeometry, tp: int, order: tuple[int, ...] | None) -> HeadPlan:
    """The head plan for `tp` shards; RecipeError (exit 1) for a T the heads cannot split into."""
    h, kv = geom.heads, geom.kv_heads
    if tp < 1:
        raise RecipeError(f"--tp {tp}: must be at least 1", hint="e.g. --tp 2")
    if h % tp:
        raise RecipeError(f"--tp {tp} does not divide the {h} query heads",
                          hint="choose a TP size that divides num_attention_heads: "
                               + ", ".join(str(t) for t in range(1, h + 1) if h % t == 0))
    if kv % tp and tp % kv:
        raise RecipeError(f"--tp {tp} neither divides the {kv} KV heads nor is a multiple of them, so "
                          f"KV heads can be neither split nor replicated evenly across shards",
                          hint="choose a TP size that divides num_key_value_heads or is a multiple of it")
    if h % kv:
        raise RecipeError(f"{h} query heads are not a multiple of {kv} KV heads",
                          hint="the checkpoint's config.json is inconsistent")
    if tp <= kv:
        kv_map = tuple(range(kv))
    else:  # one KV head per shard: shard r's query heads all read source KV head r // (tp / kv)
        kv_map = tuple(r // (tp // kv) for r in range(tp))
    if geom.rotary_dim % 2 or (order is not None and len(order) != geom.head_dim):
        raise RecipeError(f"rotary dim {geom.rotary_dim} of head_dim {geom.head_dim} cannot be permuted",
                          hint="drop --set layout.rope for this model")
    return HeadPlan(geom, tp, kv_map, order)


def split_rows(n: int, tp: int, what: str) -> list[range]:
    """Contiguous row ranges of `n` rows for `tp` shards (gate/up, MoE w1/w3)."""
    if n % tp:
        raise RecipeError(f"--tp {tp} does not divide {what}'s {n} rows",
                          hint=f"choose a TP size that divides {n}")
    step = n // tp
    return [range(r * step, (r + 1) * step) for r in range(tp)]
