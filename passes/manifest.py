"""`manifest`: write tfcompile/manifest.json, the artifact's record of itself.

It holds no timestamps, absolute paths or timings, so the same inputs and
recipe give a byte-identical artifact.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tfcompile import __version__
from tfcompile.artifact.integrity import seal
from tfcompile.calibration.moe import manifest_record as moe_record
from tfcompile.io.hub import hub_source
from tfcompile.io.oserrors import write_error
from tfcompile.io.sources import source_format
from tfcompile.pipeline.passes import PassResult, register_pass

SCHEMA_VERSION = 1
MANIFEST = "tfcompile/manifest.json"
_DEPS = ("torch", "safetensors", "compressed-tensors", "nvidia-modelopt", "triton", "numpy")


@dataclass(frozen=True)
class ManifestConfig:
    pass


def dependency_versions() -> dict[str, str | None]:
    out = {}
    for d in _DEPS:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = None
    return out


def summarize(layers: list[dict], bytes_in: int, bytes_out: int) -> dict:
    finite = [x["sqnr_db"] for x in layers if x.get("sqnr_db") is not None]
    return {
        "quantized_linears": len(layers),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "compression_ratio": round(bytes_in / bytes_out, 4) if bytes_out else None,
        "worst_sqnr_db": min(finite) if finite else None,
        "median_sqnr_db": sorted(finite)[len(finite) // 2] if finite else None,
    }


@register_pass("manifest", config=ManifestConfig,
               requires=("source", "model", "plan", "program", "artifact"), produces=("manifest",))
def manifest(ctx, cfg: ManifestConfig, reporter) -> PassResult:
    """Record versions, the recipe, checksums and per-layer figures."""
    art, plan = ctx.artifact, ctx.plan
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tfcompile", "version": __version__},
        "dependencies": dependency_versions(),
        "recipe": ctx.recipe.to_dict(),
        "source": {"name": Path(ctx.source_path).name, "architecture": ctx.model.architecture,
                   "dtype": ctx.model.dtype, "files": art.sources, "format": source_format(ctx.source),
                   **hub_source(ctx.source_path)},
        "family": plan.family,
        "scheme": {"name": plan.scheme.name, "weight": plan.scheme.weight,
                   "granularity": plan.scheme.granularity, "block": list(plan.scheme.block),
                   "activations": plan.scheme.act, "mx_rule": ctx.program.mx_rule
                   if plan.scheme.weight.startswith("mx") else None,
                   "kv_cache": {"dtype": "nvfp4" if ctx.program.kv_format == "nvfp4" else "fp8_e4m3",
                                "strategy": ctx.program.kv_strategy}
                   if ctx.program.kv_strategy else None},
        "kv_modules": list(ctx.program.kv_modules),
        "views": list(art.views),
        "groups": [[t.module for t in g.members] for g in plan.groups if len(g.members) > 1],
        "ignore": list(plan.ignore),
        "files": art.files,
        "layers": [_clean(x) for x in art.layers],
        "summary": summarize(list(art.layers), art.bytes_in, art.bytes_out),
    }
    if getattr(plan, "mixed", None):  # mixed precision: the search and each group's format (passes/mixed.py)
        doc["mixed"] = plan.mixed
    moe = moe_record(ctx.calib) if ctx.calib is not None else None
    if moe:  # per-expert routed calibration tokens and the fallback policy (calibration/moe.py)
        doc["moe"] = moe
    # a pass that replaced source weights (distill: tfcompile/io/overlay.py) says how, e.g. {"distill": ...}
    doc.update(getattr(ctx.source, "provenance", None) or {})
    if getattr(plan, "layout", None) is not None:  # --layout: what each transform did (passes/layout.py)
        from tfcompile.passes.layout import manifest_record

        doc["layout"] = manifest_record(ctx, art.files)
    write_manifest(Path(ctx.out_dir), doc)
    return PassResult(ctx.with_(manifest=doc), {"path": MANIFEST})


def write_manifest(out_dir: Path, doc: dict) -> None:
    """Write OUT/tfcompile/manifest.json atomically (temp file + rename), deterministic JSON.

    manifest.json is not in its own `files` list, so a later pass (eval) may
    rewrite it without invalidating any recorded checksum."""
    path = Path(out_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(seal(doc), indent=2, sort_keys=True) + "\n")  # seal: verify's `manifest integrity`
        os.replace(tmp, path)
    except OSError as e:  # disk full, quota, read-only: a user error naming the file, not a crash
        raise write_error(path, e) from e


def _clean(layer: dict) -> dict:
    """The per-layer record as stored: finite SQNR or null; no timings (not reproducible)."""
    v = layer.get("sqnr_db")
    out = dict(layer, sqnr_db=None if v is None or not math.isfinite(v) else v)
    out.pop("timing", None)
    return out
