"""`tfcompile quantize MODEL -o OUT`: a Hugging Face checkpoint into an artifact."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.cli.eval import quantize_eval_failed, quantize_eval_table, table_rows
from tfcompile.cli.flags import (ArtifactOptions, artifact_options, emit_options, eval_options, junit_option,
                                   layout_options, load_options, quantize_options, recipe_options)
from tfcompile.cli.output import emit_json
from tfcompile.cli.runner import ArtifactRun
from tfcompile.cli.task_gates import tasks_table
from tfcompile.evaluate.junit import write_junit
from tfcompile.errors import TfcompileError
from tfcompile.recipe.options import RunOptions


@click.command()
@artifact_options
@load_options
@recipe_options
@quantize_options
@eval_options
@junit_option
@emit_options
@layout_options
def quantize(art: ArtifactOptions, run: RunOptions, junit: Path | None) -> None:
    """Quantize the Hugging Face checkpoint MODEL into an artifact at OUT.

    With --eval, exit 1 when a gate is missed: nothing is published at OUT, and the rejected
    artifact is kept at OUT.rejected/ (--no-keep-rejected: deleted)."""
    job = ArtifactRun(art, run)
    if junit is not None and "eval" not in job.recipe.names():  # --eval, an eval option, or the recipe's
        raise click.UsageError("--junit needs --eval (the gates it reports)")
    try:
        ctx = job.run()
    except TfcompileError as e:  # a missed --eval gate: its figures on stderr / in --json, then exit 1
        report = getattr(getattr(e, "inner", None), "report", None)
        if junit is not None and report is not None:
            write_junit(junit, report["gates"], report.get("tasks", []), name=Path(art.out).name)
        quantize_eval_failed(e, console=job.console, quiet=job.art.quiet, as_json=job.art.as_json, recipe=job.recipe,
                             warnings=job.reporter.warnings)
        raise
    evaluation = (ctx.manifest or {}).get("eval")
    if junit is not None and evaluation:
        write_junit(junit, evaluation["gates"], evaluation.get("tasks", []), name=Path(art.out).name)
    tables = [quantize_eval_table(evaluation)] if evaluation else []
    tables += [tasks_table(evaluation["tasks"])] if evaluation and evaluation.get("tasks") else []
    job.print_summary(ctx, *tables)
    if job.art.as_json:
        emit_json(job.result(ctx, layers=ctx.manifest["layers"] if ctx.manifest else None, eval=evaluation,
                             eval_table=table_rows(evaluation) if evaluation else None))
