"""What a run's layout plan adds to the artifact: OUT/tfcompile/kv_cache.json, the engine view
pack streams beside the compressed-tensors view (its config.json, layout.json, tokenizer files),
and the manifest's `layout` section. The layout pass (passes/layout.py) builds the plan, the fact
`LAYOUT` declared here (`ctx.get(LAYOUT)`); pack and the manifest read it through these functions,
so no pass imports another. `ctx` is the pipeline's Context (read, never changed here).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tfcompile.facts import fact
from tfcompile.io.aux_files import copy_aux_files
from tfcompile.io.jsonfile import write_json
from tfcompile.ir import torch_dtype
from tfcompile.layout.descriptor import DESCRIPTOR, build_descriptor
from tfcompile.layout.plan import LayoutPlan, pattern
from tfcompile.layout.view import LAYOUT_JSON, EngineView, heads_record, write_view_files
from tfcompile.layout.view import open_view as _open_view


def descriptor(ctx) -> dict | None:
    """OUT/tfcompile/kv_cache.json's content for this run (pack writes it), or None."""
    lp = ctx.get(LAYOUT)
    if lp is None:
        return None
    geom = lp.heads.geom if lp.heads else None
    modules = ctx.program.kv_modules or tuple(sorted({g.key.rpartition(".")[0] for g in ctx.plan.groups
                                                      if g.key.endswith(".qkv")}))
    return build_descriptor(lp, num_layers=ctx.model.num_layers, kv_strategy=ctx.program.kv_strategy,
                            kv_modules=modules, head_dim=geom.head_dim if geom else None,
                            config=ctx.source.config)


def manifest_record(ctx, files: dict[str, str]) -> dict | None:
    """The manifest's `layout` section: each transform and what it did."""
    lp = ctx.get(LAYOUT)
    if lp is None:
        return None
    s = lp.spec
    fused = lp.fused()
    transforms = []
    if fused:
        pats = sorted({(pattern(k), tuple(v)) for k, v in fused.items()})
        transforms.append({"transform": "fuse", "linears": len(fused),
                           "names": {p: list(m) for p, m in pats}})
    if lp.heads is not None and lp.heads.order is not None:
        transforms.append({"transform": "rope", "from": s.rope_src, "to": s.rope,
                           "row_order": list(lp.heads.order), "applies_to": "q, k rows per head; q_norm, k_norm"})
    if lp.heads is not None and s.tp > 1:
        transforms.append({"transform": "tp_heads", "tp": s.tp, "kv_head_map": list(lp.heads.kv_map),
                           "q_heads_per_shard": lp.heads.q_per_shard,
                           "kv_heads_per_shard": lp.heads.kv_per_shard, "kv_replicas": lp.heads.replicas})
    view = None
    if lp.view is not None:
        view = {"dir": lp.view, "layout_json": f"{lp.view}/{LAYOUT_JSON}",
                "sha256": files.get(f"{lp.view}/{LAYOUT_JSON}")}
    return {"target": s.target, "backend": s.backend, "spec": dataclasses.asdict(s), "view": view,
            "transforms": transforms, "heads": _geometry(heads_record(lp)) if lp.heads else None,
            "kv_cache": {"descriptor": DESCRIPTOR, "sha256": files.get(DESCRIPTOR)},
            "warnings": list(lp.warnings)}


LAYOUT = fact("layout", LayoutPlan, "the engine layout (--layout): fusions, row orders, the view",
              manifest=lambda ctx, lp: {"layout": manifest_record(ctx, ctx.artifact.files)}, owner=__name__)


def _geometry(heads: dict) -> dict:
    """The head record without the row maps the transforms already list."""
    return {k: v for k, v in heads.items() if k not in ("rope_row_order", "kv_head_map")}


def open_view(ctx) -> EngineView | None:
    """The engine view pack streams beside the compressed-tensors view (None: no weight changes)."""
    return _open_view(ctx.get(LAYOUT), ctx.program, ctx.source, torch_dtype(ctx.model.dtype))


def write_files(out: Path, ctx, view: EngineView | None, layers: list[dict]) -> dict[str, str]:
    """The view's config.json / layout.json / tokenizer files and tfcompile/kv_cache.json; hashes."""
    doc = descriptor(ctx)
    if doc is None:
        return {}
    files = {DESCRIPTOR: write_json(out / DESCRIPTOR, doc)}
    if view is not None:
        shapes = {x["module"]: x["shape"] for x in layers}
        files.update(write_view_files(out, ctx[LAYOUT], ctx.source.config, ctx.plan,
                                      ctx.program.kv_strategy, shapes))
        aux = copy_aux_files(ctx.source.aux_files(), out / view.dir)
        files.update({f"{view.dir}/{k}": v for k, v in aux.items()})
    return files
