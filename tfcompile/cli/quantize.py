"""`tfcompile quantize MODEL -o OUT`: a Hugging Face checkpoint into an artifact."""

from __future__ import annotations

import click

from tfcompile.cli.eval import quantize_eval_failed, quantize_eval_table
from tfcompile.cli.options import (ArtifactOptions, artifact_options, emit_options, eval_options, layout_options,
                                   load_options, recipe_options)
from tfcompile.cli.output import emit_json
from tfcompile.cli.runner import ArtifactRun
from tfcompile.errors import TfcompileError
from tfcompile.recipe.options import RunOptions


@click.command()
@artifact_options
@load_options
@recipe_options
@eval_options
@emit_options
@layout_options
def quantize(art: ArtifactOptions, run: RunOptions) -> None:
    """Quantize the Hugging Face checkpoint MODEL into an artifact at OUT."""
    job = ArtifactRun(art, run)
    try:
        ctx = job.run()
    except TfcompileError as e:  # a missed --eval gate: its figures on stderr / in --json, then exit 1
        quantize_eval_failed(e, console=job.console, quiet=art.quiet, as_json=art.as_json, recipe=job.recipe,
                             warnings=job.reporter.warnings)
        raise
    evaluation = (ctx.manifest or {}).get("eval")
    job.print_summary(ctx, *([quantize_eval_table(evaluation)] if evaluation else []))
    if art.as_json:
        emit_json(job.result(ctx, layers=ctx.manifest["layers"] if ctx.manifest else None, eval=evaluation))
