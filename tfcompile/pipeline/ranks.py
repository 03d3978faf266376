"""One pass on one rank under torchrun (the manager's call when `ctx.world` is set).

Passes that only write files or read the finished artifact (ROOT_ONLY) run on rank 0; the
others receive the context fields they produce. Every other pass runs on every rank and
divides its own work (calibrate: batches; pack: shards and solves; distill: micro-batches;
eval: batches). After each pass the ranks meet at a barrier, so a failure surfaces at the
latest at the end of the pass it happened in, named by rank and pass (tfcompile/dist/failure.py).
Finish hooks (the manifest and report files) run on rank 0 only (manager.run).
"""

from __future__ import annotations

from tfcompile.dist.failure import inject_fault, note_pass
from tfcompile.dist.world import World
from tfcompile.errors import RecipeError
from tfcompile.pipeline.context import Context
from tfcompile.pipeline.passes import PassResult, PassSpec

# pass -> context fields rank 0 computes and shares
ROOT_ONLY = {"manifest": ("manifest",), "verify": ("verify",), "emit": ("artifact",),
             "onnx": ("artifact",), "emit_cutlass": ("artifact", "cutlass")}


def run_pass(world: World, spec: PassSpec, ctx: Context, cfg, reporter) -> PassResult:
    """`spec.run(ctx, cfg, reporter)` on this rank, or rank 0's result for a ROOT_ONLY pass."""
    note_pass(world, spec.name)
    inject_fault(world, spec.name)
    if spec.name in ROOT_ONLY and world.distributed:
        if world.is_root:
            result = spec.run(ctx, cfg, reporter)
            world.share(f"pass/{spec.name}", ({f: getattr(result.ctx, f) for f in ROOT_ONLY[spec.name]},
                                              dict(result.stats)))
        else:
            fields, stats = world.fetch(f"pass/{spec.name}")
            result = PassResult(ctx.with_(**fields), stats)
    else:
        result = spec.run(ctx, cfg, reporter)
    if spec.name == "layout" and getattr(result.ctx.layout, "view", None) is not None:
        raise RecipeError("an engine view that rewrites weights (OUT/<engine>/) is not written by more than "
                          "one process yet", hint="run this --layout without torchrun, or drop --tp / the "
                          "fused-weights engine")
    world.barrier(f"end of {spec.name}")
    return result
