"""The manifest document (tfcompile/manifest.json) of the facts passes returned.

`manifest_doc(ctx)` assembles it from the context: the model, plan and program, every file the
artifact holds (pack, emit, onnx, emit_cutlass add theirs to `ctx.artifact`),
the source's provenance (distillation), and the section each pass's fact adds (`fact_sections`:
calibration, layout, emit_cutlass's sources, the evaluation, ...). The `manifest` pass writes it;
`verify` checks the artifact against it and `eval` keeps it with a rejected artifact, so it lives
here, where every pass can build it without importing another pass. It holds no timestamps, absolute paths or
timings, so the same inputs and recipe give a byte-identical artifact (tfcompile/artifact/manifest.py).
"""

from __future__ import annotations

import math
from importlib import metadata
from pathlib import Path

from tfcompile import __version__
from tfcompile.artifact.integrity import seal
from tfcompile.artifact.manifest import SCHEMA_VERSION
from tfcompile.facts import FACTS
from tfcompile.io.hub import hub_source
from tfcompile.io.jsonfile import JsonDict
from tfcompile.io.sources import source_format
from tfcompile.ir import LayerStats
from tfcompile.machine import cpu_profile
from tfcompile.pipeline.context import Context
from tfcompile.rotate.online import record as online_record
from tfcompile.schemes import get_kv_format

_DEPS = ("torch", "safetensors", "compressed-tensors", "nvidia-modelopt", "triton", "numpy")


def dependency_versions() -> dict[str, str | None]:
    out = {}
    for d in _DEPS:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = None
    return out


def summarize(layers: list[LayerStats], bytes_in: int, bytes_out: int) -> JsonDict:
    finite = [x["sqnr_db"] for x in layers if x.get("sqnr_db") is not None]
    return {
        "quantized_linears": len(layers),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "compression_ratio": round(bytes_in / bytes_out, 4) if bytes_out else None,
        "worst_sqnr_db": min(finite) if finite else None,
        "median_sqnr_db": sorted(finite)[len(finite) // 2] if finite else None,
    }


def manifest_doc(ctx: Context) -> JsonDict:
    """The manifest of the facts in `ctx` (versions, recipe, checksums, per-layer figures and
    each pass's section), sealed as it will be written (its integrity digest: verify checks it)."""
    art, plan, scheme = ctx.artifact, ctx.plan, ctx.plan.scheme
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tfcompile", "version": __version__},
        "dependencies": dependency_versions(),
        "recipe": ctx.recipe.to_dict(),
        "source": {"name": Path(ctx.source_path).name, "architecture": ctx.model.architecture,
                   "dtype": ctx.model.dtype, "files": art.sources, "format": source_format(ctx.source),
                   **hub_source(ctx.source_path)},
        "family": plan.family,
        "scheme": {"name": scheme.name, "weight": scheme.weight,
                   "granularity": scheme.granularity, "block": list(scheme.block),
                   "activations": scheme.act, "mx_rule": ctx.program.mx_rule if scheme.weights.has_rule else None,
                   "kv_cache": {"dtype": get_kv_format(ctx.program.kv_format).dtype,
                                "strategy": ctx.program.kv_strategy}
                   if ctx.program.kv_strategy else None,
                   **({"online_transform": online_record(ctx.program.online_hadamard)}
                      if ctx.program.online_hadamard else {})},
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
    # a pass that replaced source weights (distill: tfcompile/io/overlay.py) says how, e.g. {"distill": ...}
    doc.update(ctx.source.provenance)
    doc.update(fact_sections(ctx))
    if float_dependent(ctx):  # its bytes follow the CPU's float sums: say which CPU (tfcompile/machine.py)
        doc["machine"] = cpu_profile()
    return seal(doc)


def fact_sections(ctx: Context) -> JsonDict:
    """The sections the passes' facts add (tfcompile/facts.py `Fact.manifest`): what calibration saw
    ("calibration", "moe": calibration/record.py), the layout's transforms ("layout"), what
    emit_cutlass generated ("cutlass"), the evaluation ("eval"), and any new pass's own."""
    out: JsonDict = {}
    for name, value in ctx.facts.items():
        hook = FACTS[name].manifest
        sections = hook(ctx, value) if hook is not None else {}
        clash = sorted(set(sections) & set(out))
        if clash:  # two facts writing one section: the second would silently win
            raise ValueError(f"facts {sorted(ctx.facts)} both write manifest section(s) {clash}")
        out.update(sections)
    return out


# Passes whose results are sums of floats, rounded in an order that follows the CPU's SIMD width;
# and the weight algorithms that search or solve (everything but data-free RTN)
FLOAT_PASSES = ("rotate", "mixed", "calibrate", "distill", "eval")


def float_dependent(ctx: Context) -> bool:
    """Whether the artifact's bytes depend on the CPU (tfcompile/machine.py): a calibrated, rotated,
    searched, solved, distilled or evaluated run. Data-free RTN is integer-exact: the same bytes on
    every CPU, and its manifest names none (docs/cli.md "Reproducibility")."""
    names = ctx.recipe.names()
    algorithm = ctx.recipe.config("quantize").algorithm if "quantize" in names else "rtn"
    return any(n in names for n in FLOAT_PASSES) or algorithm != "rtn"  # calib comes only from calibrate


def _clean(layer: LayerStats) -> LayerStats:
    """The per-layer record as stored: finite SQNR or null; no timings (not reproducible)."""
    v = layer.get("sqnr_db")
    out = dict(layer, sqnr_db=None if v is None or not math.isfinite(v) else v)
    out.pop("timing", None)
    return out
