"""One pipeline over N ranks: the same passes on every rank, one staging directory, one publish.

- Rank 0 creates the staging directory beside OUT (tfcompile/io/atomic.py) and shares its
  path; every rank writes its own shards into it (pack), rank 0 writes config.json, the index
  and the manifest, runs verify (and emit, onnx), then renames it into place after
  every rank has finished. So OUT appears complete or not at all, whichever rank fails.
- A missed --eval gate (every rank computes the same figures, so every rank misses it in the
  same pass): `reject(err, staging)` runs on every rank before anything is removed; api.py's
  keeps the complete staging directory at OUT.rejected on rank 0 while the other ranks wait for
  it, so it is kept exactly once and no rank exits (torchrun then stops the rest) before.
- Each pass on each rank: tfcompile/pipeline/ranks.py (rank 0 alone for the passes that only
  write files or read the finished artifact; a barrier after every pass).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tfcompile.dist.failure import supervise
from tfcompile.dist.world import World
from tfcompile.errors import UserError
from tfcompile.pipeline import manager
from tfcompile.pipeline.context import Context
from tfcompile.recipe import Recipe
from tfcompile.reporter import Reporter


def run_distributed(world: World, model_dir: Path, out_dir: Path | None, recipe: Recipe, *,
                    reporter: Reporter | None, open_output, finish=None, reject=None) -> Context:
    """`api.run_pipeline` on rank `world.rank` of `world.size`. `open_output()`: the atomic output
    directory context (rank 0 only); `finish(staging)`: rank 0's last step before it is published
    (signing); `reject(err, staging)`: every rank's first step when the passes raised `err`
    (keeping a rejected artifact), before the staging directory is removed."""
    world.begin_run()
    staging: Path | None = None
    with supervise(world):
        manager.validate(recipe)
        if not manager.writes_artifact(recipe) or out_dir is None:
            return manager.run(Context(source_path=Path(model_dir), out_dir=None, recipe=recipe, world=world),
                               recipe, reporter)
        try:
            if world.is_root:
                with open_output() as staging:  # its cleanup runs first: reject inside it
                    world.share("staging", str(staging))
                    ctx = _run(world, model_dir, staging, recipe, reporter, reject)
                    if finish is not None:
                        finish(staging)
            else:
                staging = _peer_staging(world.fetch("staging"), out_dir)
                ctx = _run(world, model_dir, staging, recipe, reporter, reject)
            world.barrier("published")  # nobody reports success before OUT exists
        except BaseException:
            if staging is not None:  # rank 0's own cleanup may not run (it may be the one killed)
                shutil.rmtree(staging, ignore_errors=True)
            raise
    return ctx.with_(out_dir=Path(out_dir))


def _peer_staging(shared: str, out_dir: Path) -> Path:
    """Rank 0's staging dir as another rank receives it: only ever a `.OUT.tmp-*` sibling of OUT
    (tfcompile/io/atomic.py names it so), since this rank writes into it and deletes it on failure."""
    staging, out = Path(shared), Path(out_dir).absolute()
    if staging.parent != out.parent or not staging.name.startswith(f".{out.name}.tmp-"):
        raise UserError(f"rank 0 shared the staging dir {staging}, which is not a temp dir beside {out}",
                        hint="run every rank with the same -o and working directory")
    return staging


def _run(world: World, model_dir: Path, staging: Path, recipe: Recipe, reporter: Reporter | None,
         reject=None) -> Context:
    ctx = Context(source_path=Path(model_dir), out_dir=staging, recipe=recipe, world=world)
    try:
        ctx = manager.run(ctx, recipe, reporter)
    except BaseException as e:
        if reject is not None:
            reject(e, staging)
        raise
    world.barrier("before publish")
    return ctx
