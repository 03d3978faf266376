"""`tfcompile distill MODEL -o OUT`: quantization-aware distillation, then an ordinary artifact."""

from __future__ import annotations

import sys

import click

from tfcompile.cli.options import (ArtifactOptions, artifact_options,
                                   distill_options, recipe_options)
from tfcompile.cli.output import (RichReporter, emit_json,
                                  live_progress_allowed, stderr_console)
from tfcompile.cli.tables import summary_table
from tfcompile.recipe.options import RunOptions


@click.command()
@artifact_options
@recipe_options
@distill_options
def distill(art: ArtifactOptions, run: RunOptions) -> None:
    """Quantize MODEL with quantization-aware distillation against the original; write OUT."""
    from tfcompile import \
        api  # lazy: every pass and the libraries they import (onnx among them; ~3 s here): only the commands that run passes pay it

    console = stderr_console()
    recipe = run.to_recipe()
    reporter = RichReporter(console, quiet=art.quiet)
    if not art.quiet and not live_progress_allowed(console):  # plain progress lines (loss, ETA) off a TTY
        reporter.note = console.print
    try:
        ctx = api.run_pipeline(art.model, art.out, recipe, overwrite=art.overwrite, reporter=reporter)
    except KeyboardInterrupt:
        if run.distill.get("resume_dir"):
            sys.stderr.write(f"checkpoint kept in {run.distill['resume_dir']}; rerun the same command to resume\n")
        raise
    record = (ctx.manifest or {}).get("distill")
    if ctx.manifest is not None and not art.quiet:
        console.print(summary_table(ctx.manifest))
        held = (record or {}).get("heldout") or {}
        if held.get("before") and held.get("after"):
            b, a = held["before"], held["after"]
            console.print(f"held-out ({a['tokens']} tokens): KL {b['kl_mean']:.5f} -> {a['kl_mean']:.5f} nats/token, "
                          f"perplexity {b['perplexity']:.3f} -> {a['perplexity']:.3f} "
                          f"(reference {a['reference_perplexity']:.3f}), round-to-nearest -> distilled")
        console.print(f"wrote [bold]{art.out}[/]")
    if art.as_json:
        emit_json({"ok": True, "output": str(art.out) if ctx.artifact else None,
                   "recipe": recipe.to_dict(), "passes": ctx.pass_stats,
                   "summary": ctx.manifest["summary"] if ctx.manifest else None,
                   "distill": record, "warnings": reporter.warnings})
