"""The layout plan: how every quantized group and copied tensor appears in the engine view.

Built once by the `layout` pass (passes/layout.py) from the resolved options
(`LayoutSpec`), config.json's head geometry and select's QuantPlan; the pass
produces it as the context's `layout`. pack streams the view from it
(view.py), manifest records it (`record`), the reference decoder reads the
view's layout.json written from it.

A view Linear is a list of `Piece`s: rows of one group member, gathered
(rope order, TP head order, KV replication) and concatenated in view row
order. A fused q/k/v with T shards is [q_0; k_0; v_0; q_1; k_1; v_1; ...],
so shard r's rows are one contiguous slice of qkv_proj; gate/up likewise
[gate_0; up_0; ...]. Groups absent from `groups` are written unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from tfcompile.errors import RecipeError
from tfcompile.ir import QuantGroup, QuantPlan
from tfcompile.layout.heads import HeadPlan, split_rows

# member leaf name -> projection role in its fused group
PROJ = {"q_proj": "q", "query": "q", "k_proj": "k", "key": "k", "v_proj": "v", "value": "v",
        "gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up"}
# select's group role -> fused module leaf in the view (vLLM's / SGLang's in-memory names)
FUSED_NAME = {"qkv": "qkv_proj", "gate_up": "gate_up_proj", "w13": "w13"}
_ORDER = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up"), "w13": ("gate", "up")}
_NORMS = {"q_norm": "q", "k_norm": "k"}


@dataclass(frozen=True)
class LayoutSpec:
    """Resolved layout options (every default filled in; passes/layout.py builds it)."""
    target: str  # engine: vllm | sglang | trtllm
    backend: str  # attention backend of that engine
    fuse_qkv: bool
    fuse_gate_up: bool
    rope_src: str  # the checkpoint's RoPE convention ("half" for HF Llama-family models)
    rope: str  # the view's
    tp: int
    kv_layout: str  # NHD | HND
    block_size: int  # tokens per KV page
    head_dim_pad: int  # head dim as stored in the KV cache (>= head_dim)
    kv_dtype: str  # bf16 | fp16 | fp8_e4m3 | nvfp4
    kv_per_head: bool  # calibrated per-KV-head scales
    engine_scale: str  # how the engine reads per-head scales: "per head" | "max over heads" | "per tensor"


@dataclass(frozen=True)
class Piece:
    member: int  # index into the group's members
    rows: tuple[int, ...]  # source rows of that member, in view order


@dataclass(frozen=True)
class ViewLinear:
    module: str  # view module name (a fused name, or the member's own)
    pieces: tuple[Piece, ...]
    shards: tuple[tuple[tuple[str, int, int], ...], ...]  # per shard: (member leaf, start, stop) view rows

    @property
    def n(self) -> int:
        return sum(len(p.rows) for p in self.pieces)


@dataclass(frozen=True)
class LayoutPlan:
    spec: LayoutSpec
    heads: HeadPlan | None  # None: the model has no attention geometry we transform
    groups: Mapping[str, tuple[ViewLinear, ...]]  # group key -> its view Linears (changed groups only)
    copies: Mapping[str, tuple[str, tuple[int, ...] | None]]  # source tensor -> (view name, dim-0 rows)
    dropped: frozenset[str]  # source tensors the view folds into a fused one (member biases)
    fused_bias: Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]]  # view bias -> (source, rows) pieces
    warnings: tuple[str, ...] = ()
    view_kv_heads: int | None = None

    @property
    def view(self) -> str | None:
        """Directory of the engine view, or None when no weight changes (vLLM's default)."""
        return self.spec.target if (self.groups or self.copies or self.fused_bias) else None

    def fused(self) -> dict[str, list[str]]:
        return {v.module: _members(v) for vs in self.groups.values() for v in vs
                if len({s[0] for sh in v.shards for s in sh}) > 1}


def _members(v: ViewLinear) -> list[str]:
    seen: list[str] = []
    for sh in v.shards:
        for leaf, _, _ in sh:
            if leaf not in seen:
                seen.append(leaf)
    return seen


def build(spec: LayoutSpec, heads: HeadPlan | None, plan: QuantPlan, names: Mapping[str, tuple]) -> LayoutPlan:
    """The layout plan for select's `plan`; `names`: every source tensor -> its shape."""
    groups: dict[str, tuple[ViewLinear, ...]] = {}
    for g in plan.groups:
        views = _group_view(g, spec, heads)
        if views is not None:
            groups[g.key] = views
    copies, dropped, fused_bias = _copies(plan, groups, heads, names)
    return LayoutPlan(spec, heads, groups, copies, frozenset(dropped), fused_bias,
                      view_kv_heads=heads.view_kv_heads if heads else None)


def _role(key: str) -> str:
    return key.rpartition(".")[2]


def _group_view(g: QuantGroup, spec: LayoutSpec, heads: HeadPlan | None) -> tuple[ViewLinear, ...] | None:
    role = _role(g.key)
    projs = [PROJ.get(t.module.rpartition(".")[2]) for t in g.members]
    fuse = (role == "qkv" and spec.fuse_qkv) or (role in ("gate_up", "w13") and spec.fuse_gate_up)
    if fuse:
        if sorted(projs) != sorted(_ORDER[role]):
            raise RecipeError(f"cannot fuse {g.key}: its quantized members are "
                              f"{[t.module.rpartition('.')[2] for t in g.members]}",
                              hint="quantize every member of the group (drop the --ignore that splits it), "
                                   "or --set layout.fuse_qkv=false / layout.fuse_gate_up=false")
        return (_fused(g, role, projs, spec, heads),)
    if heads is None or not any(p in ("q", "k", "v") for p in projs):
        return None  # gate/up unfused, o_proj, down_proj ...: rows unchanged under TP too
    out = []
    for i, (t, p) in enumerate(zip(g.members, projs)):
        if p in ("q", "k", "v") and heads.changes(p):
            rows = tuple(heads.all_rows(p))
            shards = tuple(((t.module.rpartition(".")[2],) + _span(heads, p, r),) for r in range(heads.tp))
            out.append(ViewLinear(t.module, (Piece(i, rows),), shards))
    return tuple(out) or None


def _span(heads: HeadPlan, p: str, r: int) -> tuple[int, int]:
    n = len(heads.rows(p, 0))
    return (r * n, (r + 1) * n)


def _fused(g: QuantGroup, role: str, projs: list, spec: LayoutSpec, heads: HeadPlan | None) -> ViewLinear:
    """One fused Linear: per TP shard, each member's rows for that shard, in _ORDER."""
    parent = g.key.rpartition(".")[0]
    by_proj = {p: i for i, p in enumerate(projs)}
    pieces, shards, at = [], [], 0
    for r in range(spec.tp):
        shard = []
        for p in _ORDER[role]:
            i = by_proj[p]
            t = g.members[i]
            if role == "qkv":
                if heads is None:
                    raise RecipeError(f"{g.key}: no attention head geometry in config.json",
                                      hint="--set layout.fuse_qkv=false")
                rows = heads.rows(p, r)
            else:
                rows = list(split_rows(t.shape[0], spec.tp, t.module)[r])
            pieces.append(Piece(i, tuple(rows)))
            shard.append((t.module.rpartition(".")[2], at, at + len(rows)))
            at += len(rows)
        shards.append(tuple(shard))
    return ViewLinear(f"{parent}.{FUSED_NAME[role]}", tuple(pieces), tuple(shards))


def _copies(plan: QuantPlan, groups, heads: HeadPlan | None, names: Mapping[str, tuple]):
    """Copied tensors the view changes: biases and unquantized q/k/v rows, q/k norms."""
    member_of = {t.module: (g, i) for g in plan.groups for i, t in enumerate(g.members)}
    copies, dropped, fused_bias = {}, set(), {}
    for key, views in groups.items():
        g = next(x for x in plan.groups if x.key == key)
        for v in views:
            biases = [f"{g.members[p.member].module}.bias" for p in v.pieces]
            have = [b in names for b in biases]
            if any(have) and not all(have):
                raise RecipeError(f"cannot fuse {v.module}: only some members have a bias",
                                  hint="--set layout.fuse_qkv=false / layout.fuse_gate_up=false")
            if all(have):
                fused_bias[f"{v.module}.bias"] = tuple((b, p.rows) for b, p in zip(biases, v.pieces))
                dropped.update(biases)
    if heads is None:
        return copies, dropped, fused_bias
    for name in plan.passthrough:
        if name in dropped:
            continue
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        p = PROJ.get(leaf)
        if p in ("q", "k", "v") and kind in ("weight", "bias") and module not in member_of:
            if heads.changes(p):  # an unquantized (--ignore'd) projection: gather its rows too
                copies[name] = (name, tuple(heads.all_rows(p)))
        elif leaf in _NORMS and kind == "weight" and heads.order is not None:
            copies[name] = (name, _norm_rows(heads, _NORMS[leaf], names[name][0], name))
    return copies, dropped, fused_bias


def _norm_rows(heads: HeadPlan, p: str, n: int, name: str) -> tuple[int, ...]:
    """q_norm/k_norm rows: per head [D] (Qwen3) or over all heads [H*D] (OLMo2)."""
    g = heads.geom
    if n == g.head_dim:
        return tuple(heads.order)
    if n == (g.heads if p == "q" else g.kv_heads) * g.head_dim:
        return tuple(heads.all_rows(p))
    raise RecipeError(f"{name} has {n} elements; expected head_dim {g.head_dim} or one per q/k row",
                      hint="drop --set layout.rope for this model")


def pattern(name: str) -> str:
    """A module name with layer / expert indices replaced by '*' (manifest summaries)."""
    return re.sub(r"\.\d+\.", ".*.", re.sub(r"\.\d+\.", ".*.", name))
