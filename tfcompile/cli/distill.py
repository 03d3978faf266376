"""`tfcompile distill MODEL -o OUT`: quantization-aware distillation, then an ordinary artifact."""

from __future__ import annotations

import sys

import click

from tfcompile.cli.flags import ArtifactOptions, artifact_options, distill_options, load_options, recipe_options
from tfcompile.cli.output import emit_json
from tfcompile.cli.distill_start import distill_start
from tfcompile.cli.runner import ArtifactRun
from tfcompile.recipe.options import RunOptions


@click.command()
@artifact_options
@load_options
@recipe_options
@distill_options
def distill(art: ArtifactOptions, run: RunOptions) -> None:
    """Quantize MODEL with quantization-aware distillation against the original; write OUT."""
    job = ArtifactRun(art, run, notes=True)
    try:
        with distill_start(job, run) as start:  # distill.init=gptq: its artifact first
            ctx = job.run()
    except KeyboardInterrupt:
        resume_dir = run.settings.get("distill", {}).get("resume_dir")
        if resume_dir:
            sys.stderr.write(f"checkpoint kept in {resume_dir}; rerun the same command to resume\n")
        raise
    record = (ctx.manifest or {}).get("distill")
    held = (record or {}).get("heldout") or {}
    lines = []
    if held.get("before") and held.get("after"):
        b, a = held["before"], held["after"]
        lines.append(f"held-out ({a['tokens']} tokens): KL {b['kl_mean']:.5f} -> {a['kl_mean']:.5f} nats/token, "
                     f"perplexity {b['perplexity']:.3f} -> {a['perplexity']:.3f} "
                     f"(reference {a['reference_perplexity']:.3f}), start -> distilled")
    job.print_summary(ctx, *lines)
    if job.art.as_json:
        emit_json(job.result(ctx, distill=record, **({"start": start} if start else {})))
