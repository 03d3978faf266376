"""Library entry points; the CLI is a thin layer over these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcompile.io.atomic import atomic_output_dir
from tfcompile.pipeline import manager
from tfcompile.pipeline.context import Context
from tfcompile.recipe.schema import Recipe


def run_pipeline(model_dir: Path, out_dir: Path | None, recipe: Recipe, *,
                 overwrite: bool = False, reporter: Any = None, world: Any = None) -> Context:
    """Validate and run `recipe` on `model_dir`.

    When the recipe packs an artifact, it is built in a temporary sibling of
    `out_dir` and renamed into place only if every pass succeeded. A recipe
    cut before `pack` (--until) writes nothing. Under torchrun (or with a
    `world` of several ranks) every rank runs it: tfcompile/dist/driver.py.
    """
    from tfcompile.dist import world as dist_world

    world = world if world is not None else dist_world.current()
    if world.distributed:
        from tfcompile.dist.driver import run_distributed

        return run_distributed(world, model_dir, out_dir, recipe, overwrite=overwrite, reporter=reporter)
    manager.validate(recipe)  # fail before touching the output directory
    if "pack" not in recipe.names() or out_dir is None:
        ctx = Context(source_path=Path(model_dir), out_dir=None, recipe=recipe)
        return manager.run(ctx, recipe, reporter)
    with atomic_output_dir(out_dir, overwrite=overwrite) as staging:
        ctx = Context(source_path=Path(model_dir), out_dir=staging, recipe=recipe)
        ctx = manager.run(ctx, recipe, reporter)
    return ctx.with_(out_dir=Path(out_dir))


def quantize(model_dir, out_dir, fmt: str = "nvfp4", **recipe_options) -> Context:
    """`tfcompile quantize` as a function: `quantize("model/", "out/", "nvfp4a16")`."""
    from tfcompile.recipe.build import build_recipe

    overwrite = recipe_options.pop("overwrite", False)
    recipe = build_recipe(fmt=fmt, **recipe_options)
    return run_pipeline(Path(model_dir), Path(out_dir), recipe, overwrite=overwrite)
