"""`distill`: quantization-aware distillation between quantize and pack.

The student is the model with the plan's Linears fake-quantized exactly as pack
will quantize them (tfcompile/distill/student.py); the teacher is the original
checkpoint. After training, the distilled weights of those Linears are written
to a temporary safetensors file and the context's `source` becomes an
`OverlayCheckpoint` (tfcompile/io/overlay.py) that serves them in place of the
originals, so pack re-quantizes them with the program's own rules and streams
the artifact as usual. The manifest records the run (config, data, held-out
KL/perplexity before and after) under "distill". Settings: DistillConfig
(tfcompile/distill/config.py; docs/cli.md "distill").
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tfcompile.distill.config import SCALE_FORMATS, DistillConfig
from tfcompile.errors import RecipeError
from tfcompile.io.overlay import OverlayCheckpoint
from tfcompile.pipeline.passes import PassResult, register_pass
from tfcompile.schemes import SCHEMES


def _supports(recipe, cfg: DistillConfig) -> str | None:
    names = list(recipe.names())
    if "pack" in names and names.index("pack") < names.index("distill"):
        return "distill must run before pack (pack writes what distill trained)"
    if "quantize" in names and recipe.config("quantize").algorithm != "rtn":
        raise RecipeError(f"distill trains from round-to-nearest weights; quantize.algorithm is "
                          f"{recipe.config('quantize').algorithm!r}",
                          hint="drop --algorithm (distillation re-quantizes its weights with RTN rules)")
    fmt = recipe.config("select").format if "select" in names else recipe.format
    if cfg.train == "scales" and fmt in SCHEMES and SCHEMES[fmt].weight not in SCALE_FORMATS:
        raise RecipeError(f"distill.train scales needs per-block weight scales; {fmt} has "
                          f"{SCHEMES[fmt].granularity} FP8 scales",
                          hint="use an NVFP4, MXFP4 or MXFP8 format, or --set distill.train=weights")
    return None


@register_pass("distill", config=DistillConfig, requires=("source", "model", "plan", "program"),
               produces=("source",), supports=_supports)
def distill(ctx, cfg: DistillConfig, reporter) -> PassResult:
    """Train the fake-quantized student against the original model; pack then packs its weights."""
    from tfcompile.distill.run import distill_checkpoint

    if ctx.program.algorithm != "rtn":
        raise RecipeError(f"distill needs quantize.algorithm rtn, got {ctx.program.algorithm!r}",
                          hint="drop --algorithm")
    parent = Path(ctx.out_dir).parent if ctx.out_dir is not None else None
    work = tempfile.TemporaryDirectory(prefix=".tfcompile-distill-", dir=parent)  # removed with the overlay
    outcome = distill_checkpoint(ctx, cfg, reporter, Path(work.name))
    source = OverlayCheckpoint(ctx.source, outcome.weights, {"distill": outcome.record}, keep=work)
    return PassResult(ctx.with_(source=source), outcome.stats)
