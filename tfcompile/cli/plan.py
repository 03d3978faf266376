"""`tfcompile plan`: the resolved recipe as JSON, checked, without running it; with --estimate,
what the run needs (tfcompile/estimate: output size, memory per rank, disk, time per pass)."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.cli.flags import (emit_options, eval_options, layout_options,
                                   recipe_options)
from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.estimate.report import estimate_table
from tfcompile.recipe.options import RunOptions


@click.command()
@click.argument("model", required=False, type=click.Path(path_type=Path))
@recipe_options
@eval_options
@emit_options
@layout_options
@click.option("--estimate", is_flag=True, help="Estimate the run from MODEL/config.json alone (no weights): "
              "output size, host and device memory per rank, disk, seconds per pass (docs/distributed.md).")
@click.option("--devices", default="cpu", show_default=True, metavar="NxDEVICE",
              help="With --estimate: per node, e.g. 8xH200, 8xH100, 8xB200; cpu or 2xcpu: processes here.")
@click.option("--nodes", default=1, show_default=True, type=int, help="With --estimate: nodes.")
@click.option("--json", "as_json", is_flag=True, help="With --estimate: the estimate as JSON on stdout.")
def plan(model: Path | None, run: RunOptions, estimate: bool, devices: str, nodes: int, as_json: bool) -> None:
    """Print the resolved recipe (JSON on stdout) without running it; --estimate: what it needs."""
    if estimate and model is None:
        raise click.UsageError("plan --estimate needs MODEL (a directory with config.json, or the file), "
                               "e.g. tfcompile plan examples/configs/deepseek-v3 --format nvfp4 --estimate")
    run.check_names()
    # lazy: every pass and the libraries they import (onnx among them, ~3 s here); importing it
    # registers the passes the recipe names
    from tfcompile import api
    from tfcompile.recipe.build import options_recipe

    recipe = options_recipe(run)
    specs = api.manager.validate(recipe)
    if estimate:
        # lazy: the estimator imports torch and transformers (the model on the meta device)
        from tfcompile.estimate.plan import estimate as run_estimate

        doc = run_estimate(model, recipe, devices, nodes)
        if as_json:
            emit_json(doc)
        else:
            stderr_console().print(estimate_table(doc))
        return
    doc = recipe.to_dict()
    for entry, spec in zip(doc["passes"], specs):
        entry["requires"], entry["produces"] = sorted(spec.requires), sorted(spec.produces)
    emit_json(doc)
