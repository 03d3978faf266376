"""Library entry points; the CLI is a thin layer over these.

Importing this module registers the built-in passes (tfcompile.passes.builtin): the
pipeline core imports no pass, its entry points do (docs/design.md "Layers").
"""

from __future__ import annotations

from pathlib import Path

import tfcompile.passes.builtin  # noqa: F401  (registers the built-in passes)
from tfcompile.io.atomic import atomic_output_dir
from tfcompile.pipeline import manager
from tfcompile.pipeline.context import Context
from tfcompile.pipeline.recipe import Recipe
from tfcompile.recipe.build import build_recipe
from tfcompile.report import Reporter


def run_pipeline(model_dir: Path, out_dir: Path | None, recipe: Recipe, *,
                 overwrite: bool = False, reporter: Reporter | None = None) -> Context:
    """Validate and run `recipe` on `model_dir`.

    When the recipe packs an artifact, it is built in a temporary sibling of
    `out_dir` and renamed into place only if every pass succeeded. A recipe
    cut before `pack` (--until) writes nothing.
    """
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
    overwrite = recipe_options.pop("overwrite", False)
    recipe = build_recipe(fmt=fmt, **recipe_options)
    return run_pipeline(Path(model_dir), Path(out_dir), recipe, overwrite=overwrite)
