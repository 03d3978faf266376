"""`calibrate`: activation statistics for schemes with static input scales."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tfcompile.calibration.forward import observe_input_amax
from tfcompile.passes.quantize.program import torch_dtype
from tfcompile.errors import RecipeError
from tfcompile.pipeline.passes import PassResult, register_pass


@dataclass(frozen=True)
class CalibrateConfig:
    data: str = "self"  # file / saved data set / cached data set name / "self" / "random"
    samples: int = 16  # sequences
    seq_len: int = 128  # tokens per sequence
    seed: int = 0
    kv_cache: str = ""  # "" (keep the engine's default KV dtype) | "fp8": calibrate k_scale/v_scale
    kv_per_head: bool = False  # one KV scale per KV head instead of per tensor
    hessian: bool = False  # record H = X^T X / n per fusion group (for quantize.algorithm=gptq)


@register_pass("calibrate", config=CalibrateConfig, requires=("source", "model", "plan"),
               produces=("calib",))
def calibrate(ctx, cfg: CalibrateConfig, reporter) -> PassResult:
    """Observe max |x| at every quantized Linear's input (model-sampled tokens by default)."""
    if cfg.kv_cache not in ("", "fp8"):
        raise RecipeError(f"calibrate.kv_cache {cfg.kv_cache!r} is not supported",
                          hint="use --kv-cache fp8 (FP8 E4M3 with calibrated scales)")
    modules = {t.module for t in ctx.plan.targets()}
    stats = observe_input_amax(ctx.source_path, modules, data=cfg.data, samples=cfg.samples,
                               seq_len=cfg.seq_len, seed=cfg.seed, dtype=torch_dtype(ctx.model.dtype),
                               kv=bool(cfg.kv_cache),
                               hessian_groups={g.members[0].module: g.key for g in ctx.plan.groups}
                               if cfg.hessian else None)
    if cfg.kv_cache:
        stats = dataclasses.replace(stats, kv_strategy="attn_head" if cfg.kv_per_head else "tensor")
    for m in stats.fallback:
        reporter.warn(f"calibrate: no token reached {m}; used the fallback scale")
    return PassResult(ctx.with_(calib=stats), {"tokens": stats.tokens, "source": stats.source,
                                               "fallback_modules": list(stats.fallback),
                                               "kv_attention_modules": len(stats.kv_amax),
                                               "hessians": len(stats.hessians)})
