"""`tfcompile quantize MODEL -o OUT`: a Hugging Face checkpoint into an artifact."""

from __future__ import annotations

import click

from tfcompile.cli.eval import quantize_eval_failed, quantize_eval_table
from tfcompile.cli.options import (ArtifactOptions, artifact_options,
                                   emit_options, eval_options, layout_options,
                                   recipe_options)
from tfcompile.cli.output import RichReporter, emit_json, stderr_console
from tfcompile.cli.tables import summary_table
from tfcompile.errors import TfcompileError
from tfcompile.recipe.options import RunOptions


@click.command()
@artifact_options
@recipe_options
@eval_options
@emit_options
@layout_options
def quantize(art: ArtifactOptions, run: RunOptions) -> None:
    """Quantize the Hugging Face checkpoint MODEL into an artifact at OUT."""
    from tfcompile import \
        api  # lazy: every pass and the libraries they import (onnx among them; ~3 s here): only the commands that run passes pay it

    console = stderr_console()
    recipe = run.to_recipe()
    reporter = RichReporter(console, quiet=art.quiet)
    try:
        ctx = api.run_pipeline(art.model, art.out, recipe, overwrite=art.overwrite, reporter=reporter)
    except TfcompileError as e:  # a missed --eval gate: its figures on stderr / in --json, then exit 1
        quantize_eval_failed(e, console=console, quiet=art.quiet, as_json=art.as_json, recipe=recipe,
                             warnings=reporter.warnings)
        raise
    evaluation = (ctx.manifest or {}).get("eval")
    if ctx.manifest is not None and not art.quiet:
        console.print(summary_table(ctx.manifest))
        if evaluation:
            console.print(quantize_eval_table(evaluation))
        console.print(f"wrote [bold]{art.out}[/]")
    if art.as_json:
        emit_json({"ok": True, "output": str(art.out) if ctx.artifact else None,
                   "recipe": recipe.to_dict(), "passes": ctx.pass_stats,
                   "summary": ctx.manifest["summary"] if ctx.manifest else None,
                   "layers": ctx.manifest["layers"] if ctx.manifest else None,
                   "eval": evaluation, "warnings": reporter.warnings})
