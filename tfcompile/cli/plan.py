"""`tfcompile plan`: the resolved recipe as JSON, checked, without running it."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.cli.options import (emit_options, eval_options, layout_options,
                                   recipe_options)
from tfcompile.cli.output import emit_json
from tfcompile.recipe.options import RunOptions


@click.command()
@click.argument("model", required=False, type=click.Path(path_type=Path))
@recipe_options
@eval_options
@emit_options
@layout_options
def plan(model: Path | None, run: RunOptions) -> None:
    """Print the resolved recipe (JSON on stdout) without running it."""
    # lazy: every pass and the libraries they import (onnx among them, ~3 s here); importing it
    # registers the passes the recipe names
    from tfcompile import api

    recipe = run.to_recipe()
    specs = api.manager.validate(recipe)
    doc = recipe.to_dict()
    for entry, spec in zip(doc["passes"], specs):
        entry["requires"], entry["produces"] = sorted(spec.requires), sorted(spec.produces)
    emit_json(doc)
