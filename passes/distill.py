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

from pathlib import Path

from tfcompile.distill.config import DistillConfig
from tfcompile.errors import RecipeError
from tfcompile.io.locks import work_dir
from tfcompile.ir import torch_dtype
from tfcompile.pipeline.intents import RunsTheModel, SingleScheme, TrainsOnTheSource, WeightRounding
from tfcompile.pipeline.passes import PassResult, Unsupported, get_pass, given, recipe_intent, register_pass
from tfcompile.recipe import Recipe
from tfcompile.schemes import DISTILL_STARTS, SCHEMES


def _supports(recipe: Recipe, cfg: DistillConfig) -> list[Unsupported]:
    names, reasons = list(recipe.names()), []
    writer = next((n for n in names if "artifact" in get_pass(n).produces), None)
    if writer is not None and names.index(writer) < names.index("distill"):
        reasons.append(Unsupported(f"distill must run before {writer} (it writes what distill trained)"))
    algorithm = recipe_intent(recipe, WeightRounding, WeightRounding("rtn", "")).algorithm
    if algorithm != "rtn":
        reasons.append(Unsupported(f"distill trains from round-to-nearest weights; quantize.algorithm is "
                                   f"{algorithm!r}",
                                   "drop --algorithm (distillation re-quantizes its weights with RTN rules)"))
    if cfg.init in DISTILL_STARTS and not cfg.init_artifact:  # tfcompile/cli/distill_start.py sets it
        reasons.append(Unsupported(f"distill.init {cfg.init}: the start artifact is built by `tfcompile distill`, "
                                   "and this run has none",
                                   f"run `tfcompile distill --init {cfg.init}`, or `tfcompile quantize --algorithm "
                                   f"{cfg.init} -o A` first and give --init A"))
    fmt = recipe.quant_format()
    # one learnable clip per block: the formats with block scales
    if cfg.train == "scales" and fmt in SCHEMES and not SCHEMES[fmt].weights.block_scaled:
        reasons.append(Unsupported(f"distill.train scales needs per-block weight scales; {fmt} has "
                                   f"{SCHEMES[fmt].granularity} weight scales",
                                   "use an NVFP4, MXFP4 or MXFP8 format, or --set distill.train=weights"))
    return reasons


@register_pass("distill", config=DistillConfig, requires=("source", "model", "plan", "program"),
               produces=("source",), supports=_supports, when=given("distill"),
               intents=lambda c: (RunsTheModel("distill"), TrainsOnTheSource("distill", c), SingleScheme("distill")))
def distill(ctx, cfg: DistillConfig, reporter) -> PassResult:
    """Train the fake-quantized student against the original model; pack then packs its weights."""
    from tfcompile.distill.run import Inputs, distill_checkpoint  # lazy: the trainer (docs/design.md "Pass modules")
    from tfcompile.io.overlay import OverlayCheckpoint
    if ctx.program.algorithm != "rtn":
        raise RecipeError(f"distill needs quantize.algorithm rtn, got {ctx.program.algorithm!r}",
                          hint="drop --algorithm")
    parent = Path(ctx.out_dir).parent if ctx.out_dir is not None else None
    work = work_dir(".tfcompile-distill-", parent)  # removed with the overlay; owner-tagged (io/locks.py)
    inputs = Inputs(Path(ctx.source_path), ctx.source, torch_dtype(ctx.model.dtype), ctx.plan, ctx.program,
                    ctx.recipe.to_dict(), ctx.world)
    outcome = distill_checkpoint(inputs, cfg, reporter, Path(work.name))
    source = OverlayCheckpoint(ctx.source, outcome.weights, {"distill": outcome.record}, keep=work)
    return PassResult(ctx.with_(source=source), outcome.stats)
