"""The calibration statistics as a fact of the pipeline's context, and their manifest sections.

The calibrate pass (passes/calibrate.py) produces `CALIB` (a tfcompile.ir.CalibStats: activation
amax per module, KV amax, the registered statistics, what the layer loop solved); quantize reads it
(`ctx.get(CALIB)`: a recipe may quantize without calibrating), and the manifest records what
calibration saw (its `calibration` and `moe` sections) through the fact's `manifest` hook, so
neither the pipeline core nor tfcompile/manifest_doc.py names it.
"""

from __future__ import annotations

from tfcompile.calibration.moe import manifest_record as moe_record
from tfcompile.facts import fact
from tfcompile.ir import CalibStats


def manifest_sections(ctx, stats: CalibStats) -> dict:
    """{"calibration": the data, tokens and their digest, the forwards' dtype, --calib auto's
    fallback; "moe": routed tokens per expert} (each only when there is something to record)."""
    out: dict = {}
    if stats.tokens_sha256:  # what calibration saw: auto's choice depends on the machine
        out["calibration"] = {"data": stats.source, "tokens": stats.tokens, "tokens_sha256": stats.tokens_sha256}
        if stats.compute_dtype:  # calibrate.dtype resolved: bf16 and float32 forwards differ in their bits
            out["calibration"]["compute_dtype"] = stats.compute_dtype
        if stats.data_fallback:  # --calib auto passed over python-doc (passes/calibrate.py)
            out["calibration"]["fallback"] = stats.data_fallback
    moe = moe_record(stats)
    if moe:  # per-expert routed calibration tokens and the fallback policy (calibration/moe.py)
        out["moe"] = moe
    return out


CALIB = fact("calib", CalibStats, "activation amax per module, KV amax, the registered statistics",
             manifest=manifest_sections, owner=__name__)
