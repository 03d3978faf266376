"""The engine view OUT/<target>/: the weights as the target engine reads them.

Written by pack beside the compressed-tensors view when the layout plan
changes any weight (fusion, RoPE order, TP head order / KV replication). The
main view stays the untransformed Hugging Face layout that transformers and
vLLM load. Per job of the main program, `EngineView.tensors` yields the
view's tensors in the order `specs()` planned:

- a group the layout changes: each view Linear is quantized from its
  members' gathered rows (`QuantTarget.parts`) by the program's own algorithm
  (RTN, GPTQ, AWQ, MSE), so row permutations happen *before* quantization and
  a fused group's NVFP4 global scale / FP8 per-tensor scale is one value
  computed over the whole fused weight (the max over members; never rescaled);
- an unchanged group, copy or KV scale: the main view's tensors, same names;
- member biases of a changed Linear: gathered and concatenated into its bias;
- q/k norms, unquantized q/k/v rows, per-head KV scales: gathered.

Files: `<target>/model*.safetensors`, `<target>/config.json` (source config,
`num_key_value_heads` of the view, quantization_config), `<target>/layout.json`
(the name map and row order, `layout_json`), tokenizer files.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Iterator

import torch

from tfcompile.artifact.configs import ct_quantization_config
from tfcompile.artifact.naming import ct_outputs
from tfcompile.artifact.verify import SCALE_SUFFIXES, check_scale_tensor
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.dtypes import torch_dtype_of
from tfcompile.io.jsonfile import write_json
from tfcompile.ir import Job, OutSpec, Program, QuantPlan, execute
from tfcompile.layout.plan import LayoutPlan, ViewLinear
from tfcompile.schemes import KV_BY_DTYPE

LAYOUT_JSON = "layout.json"
SCHEMA = 1
# view kv_cache_scheme for an NVFP4 KV cache: E2M1 data, dynamic E4M3 scale per 16 elements of
# head_dim, one static global scale per tensor (compressed-tensors' NVFP4 activation scheme)
NVFP4_KV_SCHEME = {"dynamic": "local", "group_size": 16, "num_bits": 4, "strategy": "tensor_group",
                   "symmetric": True, "type": "float"}


@dataclasses.dataclass(frozen=True)
class _Op:
    kind: str  # "main" | "quant" | "bias" | "gather"
    outputs: tuple  # OutSpec, in write order
    arg: Any = None  # quant: the view Job; bias: ((source, rows), ...); gather: (source name, rows)


class EngineView:
    """The engine view's write plan over `program` (one list of ops per main job)."""

    def __init__(self, layout: LayoutPlan, program: Program, source: Checkpoint, model_dtype: torch.dtype):
        self.layout, self.dir = layout, layout.view
        self.model_dtype = model_dtype
        self.program = dataclasses.replace(program, act_amax=_fused_amax(layout, program))
        self._bias_dtype = {b: torch_dtype_of(source.info(b).dtype)
                            for pieces in layout.fused_bias.values() for b, _ in pieces}
        self._ops = [self._plan(job) for job in program.jobs]
        self._next = 0

    def specs(self) -> list[OutSpec]:
        return [o for ops in self._ops for op in ops for o in op.outputs]

    def tensors(self, job: Job, main: dict[str, torch.Tensor],
                source: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
        """The view's tensors for the next main job (jobs arrive in program order)."""
        ops, self._next = self._ops[self._next], self._next + 1
        for op in ops:
            if op.kind == "main":
                for o in op.outputs:
                    yield o.name, main[o.name]
            elif op.kind == "quant":
                out, _ = execute(op.arg, self.program, source)
                for o in op.outputs:
                    if o.name.endswith(SCALE_SUFFIXES):
                        check_scale_tensor(o.name, out[o.name])
                    yield o.name, out[o.name]
            elif op.kind == "bias":
                yield op.outputs[0].name, torch.cat([source.get(b)[torch.tensor(r)] for b, r in op.arg])
            else:
                name, rows = op.arg
                t = main[name] if name in main else source.get(name)
                yield op.outputs[0].name, t[torch.tensor(rows)].contiguous()

    # -- planning ----------------------------------------------------------------------------
    def _plan(self, job: Job) -> list[_Op]:
        lay = self.layout
        if job.kind == "group":
            return self._plan_group(job)
        spec = job.outputs[0]
        if job.kind == "const":  # KV-cache scale: per-head ones follow the view's KV heads
            if len(spec.shape) == 3 and lay.heads is not None and lay.heads.replicas > 1:
                rows = lay.heads.kv_map
                return [_Op("gather", (OutSpec(spec.name, spec.dtype, (len(rows), 1, 1)),), (spec.name, rows))]
            return [_Op("main", job.outputs)]
        if job.source in lay.dropped:
            return []
        if job.source in lay.copies:
            out, rows = lay.copies[job.source]
            shape = (len(rows),) + tuple(spec.shape[1:])
            return [_Op("gather", (OutSpec(out, spec.dtype, shape),), (job.source, rows))]
        return [_Op("main", job.outputs)]

    def _plan_group(self, job: Job) -> list[_Op]:
        views = self.layout.groups.get(job.group.key)
        if views is None:
            return [_Op("main", job.outputs)]
        members, ops, covered = job.group.members, [], set()
        for v in views:
            vjob = self._view_job(job, v)
            ops.append(_Op("quant", vjob.outputs, vjob))
            covered |= {p.member for p in v.pieces}
            bias = self.layout.fused_bias.get(f"{v.module}.bias")
            if bias is not None:
                dtype = self._bias_dtype[bias[0][0]]
                ops.append(_Op("bias", (OutSpec(f"{v.module}.bias", dtype, (v.n,)),), bias))
        for i, t in enumerate(members):
            if i not in covered:
                ops.append(_Op("main", tuple(o for o in job.outputs if o.name.rpartition(".")[0] == t.module)))
        return ops

    def _view_job(self, job: Job, v: ViewLinear) -> Job:
        members = job.group.members
        k = members[0].shape[1]
        parts = tuple((members[p.member], p.rows) for p in v.pieces)
        target = dataclasses.replace(members[v.pieces[0].member], module=v.module, expert=None, rows=None,
                                     shape=(v.n, k), parts=parts)
        group = dataclasses.replace(job.group, members=(target,))  # same key: GPTQ/AWQ statistics apply
        outs = tuple(ct_outputs(self.program.scheme, v.module, v.n, k, self.model_dtype))
        return Job(group, None, outs)



def open_view(layout: LayoutPlan | None, program: Program, source: Checkpoint,
              model_dtype: torch.dtype) -> EngineView | None:
    """The engine view to stream, or None when the layout changes no weight."""
    if layout is None or layout.view is None:
        return None
    return EngineView(layout, program, source, model_dtype)


def _fused_amax(layout: LayoutPlan, program: Program) -> dict[str, float]:
    """act_amax with each view Linear's input amax: the max over its members (one input)."""
    act = dict(program.act_amax)
    if not act:
        return act
    for job in program.jobs:
        if job.kind != "group" or job.group.key not in layout.groups:
            continue
        for v in layout.groups[job.group.key]:
            mods = [job.group.members[p.member].module for p in v.pieces]
            if all(m in act for m in mods):
                act[v.module] = max(act[m] for m in mods)
    return act


def write_view_files(out: Path, layout: LayoutPlan, source_config: dict, plan: QuantPlan, kv: str | None,
                     layers: dict[str, list[int]]) -> dict[str, str]:
    """config.json and layout.json of the view; returns {relative path: sha256}."""
    d = out / layout.view
    cfg = copy.deepcopy({k: v for k, v in source_config.items() if k != "quantization_config"})
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    if layout.view_kv_heads is not None and "num_key_value_heads" in text:
        text["num_key_value_heads"] = layout.view_kv_heads
    qc = ct_quantization_config(plan.scheme, list(plan.ignore), kv)
    kv_fmt = KV_BY_DTYPE.get(layout.spec.kv_dtype)
    if kv_fmt is not None and kv_fmt.ct_preset:  # its cache described by a preset's activations (NVFP4)
        qc["kv_cache_scheme"] = dict(NVFP4_KV_SCHEME)
    cfg["quantization_config"] = qc
    return {f"{layout.view}/config.json": write_json(d / "config.json", cfg),
            f"{layout.view}/{LAYOUT_JSON}": write_json(d / LAYOUT_JSON, layout_json(layout, plan, layers))}


def layout_json(layout: LayoutPlan, plan: QuantPlan, layers: dict[str, list[int]]) -> dict:
    """The view's name map: every quantized Linear of the view with its shape, fused members and
    per-TP-shard row spans, plus the head order the reference decoder and engines need."""
    s, h = layout.spec, layout.heads
    by_key = {g.key: g for g in plan.groups}
    linears, replaced = {}, set()
    for key, views in layout.groups.items():
        g = by_key[key]
        for v in views:
            members = [g.members[p.member].module for p in v.pieces]
            replaced.update(members)
            linears[v.module] = {"shape": [v.n, g.members[0].shape[1]], "from": list(dict.fromkeys(members)),
                                 "shards": [[list(x) for x in sh] for sh in v.shards]}
    for m, shape in layers.items():
        if m not in replaced:
            linears[m] = {"shape": list(shape)}
    doc = {"schema_version": SCHEMA, "target": s.target, "backend": s.backend, "tp": s.tp,
           "rope": {"source": s.rope_src, "view": s.rope}, "linears": dict(sorted(linears.items())),
           "tensors": {k: {"to": v[0], "rows": len(v[1])} for k, v in sorted(layout.copies.items())},
           "fused_bias": {k: [b for b, _ in v] for k, v in sorted(layout.fused_bias.items())}}
    if h is not None:
        doc["heads"] = heads_record(layout)
    return doc


def heads_record(layout: LayoutPlan) -> dict:
    h = layout.heads
    g = h.geom
    return {"num_attention_heads": g.heads, "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim,
            "rotary_dim": g.rotary_dim, "view_num_key_value_heads": h.view_kv_heads,
            "q_heads_per_shard": h.q_per_shard, "kv_heads_per_shard": h.kv_per_shard,
            "kv_replicas": h.replicas, "kv_head_map": list(h.kv_map),
            "rope_row_order": list(h.order) if h.order is not None else None}
