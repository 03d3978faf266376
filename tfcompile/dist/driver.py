"""One pipeline over N ranks: the same passes on every rank, one staging directory, one publish.

- Rank 0 creates the staging directory beside OUT (tfcompile/io/atomic.py) and shares its
  path; every rank writes its own shards into it (pack), rank 0 writes config.json, the index
  and the manifest, runs verify (and emit, onnx), then renames it into place after
  every rank has finished. So OUT appears complete or not at all, whichever rank fails.
- Passes that only write files or read the finished artifact (ROOT_ONLY) run on rank 0; the
  others receive the context fields they produce. Every other pass runs on every rank and
  divides its own work (calibrate: batches; pack: shards and solves; distill: micro-batches).
- After each pass the ranks meet at a barrier, so a failure surfaces at the latest at the end
  of the pass it happened in, named by rank and pass (tfcompile/dist/failure.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tfcompile.dist.failure import inject_fault, note_pass, supervise

# pass -> context fields rank 0 computes and shares
# (eval runs on every rank: each evaluates its batches; passes/evaluate.py)
ROOT_ONLY = {"manifest": ("manifest",), "verify": ("verify",), "emit": ("artifact",),
             "onnx": ("artifact",), "emit_cutlass": ("manifest", "artifact")}


def run_pass(world, spec, ctx, cfg, reporter):
    """The manager's call of one pass on this rank (pipeline/manager.py)."""
    note_pass(world, spec.name)
    inject_fault(world, spec.name)
    if spec.name in ROOT_ONLY and world.distributed:
        from tfcompile.pipeline.passes import PassResult

        if world.is_root:
            result = spec.run(ctx, cfg, reporter)
            world.share(f"pass/{spec.name}", ({f: getattr(result.ctx, f) for f in ROOT_ONLY[spec.name]},
                                              dict(result.stats)))
        else:
            fields, stats = world.fetch(f"pass/{spec.name}")
            result = PassResult(ctx.with_(**fields), stats)
    else:
        result = spec.run(ctx, cfg, reporter)
    if spec.name == "layout" and getattr(result.ctx.plan.layout, "view", None) is not None:
        from tfcompile.errors import RecipeError

        raise RecipeError("an engine view that rewrites weights (OUT/<engine>/) is not written by more than "
                          "one process yet", hint="run this --layout without torchrun, or drop --tp / the "
                          "fused-weights engine")
    world.barrier(f"end of {spec.name}")
    return result


def run_distributed(world, model_dir: Path, out_dir: Path | None, recipe, *, reporter, open_output, finish=None):
    """`api.run_pipeline` on rank `world.rank` of `world.size`. `open_output()`: the atomic output
    directory context (rank 0 only); `finish(staging)`: rank 0's last step before it is published
    (signing)."""
    from tfcompile.pipeline import manager
    from tfcompile.pipeline.context import Context

    world.begin_run()
    staging: Path | None = None
    with supervise(world):
        manager.validate(recipe)
        if "pack" not in recipe.names() or out_dir is None:
            return manager.run(Context(source_path=Path(model_dir), out_dir=None, recipe=recipe, world=world),
                               recipe, reporter)
        try:
            if world.is_root:
                with open_output() as staging:
                    world.share("staging", str(staging))
                    ctx = _run(world, manager, Context, model_dir, staging, recipe, reporter)
                    if finish is not None:
                        finish(staging)
            else:
                staging = Path(world.fetch("staging"))
                ctx = _run(world, manager, Context, model_dir, staging, recipe, reporter)
            world.barrier("published")  # nobody reports success before OUT exists
        except BaseException:
            if staging is not None:  # rank 0's own cleanup may not run (it may be the one killed)
                shutil.rmtree(staging, ignore_errors=True)
            raise
    return ctx.with_(out_dir=Path(out_dir))


def _run(world, manager, Context, model_dir, staging, recipe, reporter):
    ctx = Context(source_path=Path(model_dir), out_dir=staging, recipe=recipe, world=world)
    ctx = manager.run(ctx, recipe, reporter)
    world.barrier("before publish")
    return ctx
