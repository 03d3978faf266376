"""`calibrate`: activation statistics for schemes with static input scales."""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.calibration.forward import observe_input_amax
from tfcompile.passes.quantize.program import torch_dtype
from tfcompile.pipeline.passes import PassResult, register_pass


@dataclass(frozen=True)
class CalibrateConfig:
    data: str = "self"  # file / saved data set / cached data set name / "self" / "random"
    samples: int = 16  # sequences
    seq_len: int = 128  # tokens per sequence
    seed: int = 0


@register_pass("calibrate", config=CalibrateConfig, requires=("source", "model", "plan"),
               produces=("calib",))
def calibrate(ctx, cfg: CalibrateConfig, reporter) -> PassResult:
    """Observe max |x| at every quantized Linear's input (model-sampled tokens by default)."""
    modules = {t.module for t in ctx.plan.targets()}
    stats = observe_input_amax(ctx.source_path, modules, data=cfg.data, samples=cfg.samples,
                               seq_len=cfg.seq_len, seed=cfg.seed, dtype=torch_dtype(ctx.model.dtype))
    for m in stats.fallback:
        reporter.warn(f"calibrate: no token reached {m}; used the fallback scale")
    return PassResult(ctx.with_(calib=stats), {"tokens": stats.tokens, "source": stats.source,
                                               "fallback_modules": list(stats.fallback)})
