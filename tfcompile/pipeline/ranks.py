"""One pass on one rank under torchrun (the manager's call when `ctx.world` is set).

Passes registered with `ranks="root"` (they only write files or read the finished artifact)
run on rank 0; the others receive the facts the pass produces (core fields and its own). Every
other pass runs on every rank and divides its own work (calibrate: batches; pack: shards and solves; distill: micro-batches;
eval: batches). After each pass the ranks meet at a barrier, so a failure surfaces at the
latest at the end of the pass it happened in, named by rank and pass (tfcompile/dist/failure.py).
Finish hooks (the manifest and report files) run on rank 0 only (manager.run).
"""

from __future__ import annotations

from tfcompile.dist.failure import inject_fault, note_pass
from tfcompile.dist.world import World
from tfcompile.pipeline.context import Context
from tfcompile.pipeline.passes import PassResult, PassSpec

def run_pass(world: World, spec: PassSpec, ctx: Context, cfg, reporter) -> PassResult:
    """`spec.run(ctx, cfg, reporter)` on this rank, or rank 0's result for a `ranks="root"` pass."""
    note_pass(world, spec.name)
    inject_fault(world, spec.name)
    if spec.ranks == "root" and world.distributed:
        if world.is_root:
            result = spec.run(ctx, cfg, reporter)
            world.share(f"pass/{spec.name}", ({f: result.ctx.value(f) for f in sorted(spec.produces)},
                                              dict(result.stats)))
        else:
            fields, stats = world.fetch(f"pass/{spec.name}")
            result = PassResult(ctx.with_named(fields), stats)
    else:
        result = spec.run(ctx, cfg, reporter)
    world.barrier(f"end of {spec.name}")
    return result
