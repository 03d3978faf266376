"""`tfcompile tune ARTIFACT`: kernel configs per target, shape and M bucket into kernels/tuning.json."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.cli.output import RichReporter, emit_json, stderr_console
from tfcompile.errors import RecipeError
from tfcompile.report import embed_report
from tfcompile.tune.hardware import parse_targets
from tfcompile.tune.registry import load_kernels
from tfcompile.tune.report import json_doc, summary_tables
from tfcompile.tune.run import tune_artifact


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--target", "targets", default="sm_90a,sm_100a", show_default=True, metavar="TARGETS",
              help="Comma-separated targets to tune for.")
@click.option("--buckets", default="1,16,64,256,1024,4096", show_default=True, metavar="M,...",
              help="M buckets (tokens in flight), decode to prefill.")
@click.option("--kernel", "kernels", multiple=True, metavar="NAME", help="Only this registered kernel.")
@click.option("--measure/--no-measure", default=None, help="Measure the best ranked configs on this "
              "machine's GPU (default: when one of the targets' GPUs is present).")
@click.option("--json", "as_json", is_flag=True, help="Print the tuning entries as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No table on stderr.")
def tune(artifact: Path, targets: str, buckets: str, kernels: tuple[str, ...], measure: bool | None,
         as_json: bool, quiet: bool) -> None:
    """Tune the artifact's kernels; write ARTIFACT/kernels/tuning.json."""
    try:
        bucket_list = [int(b) for b in buckets.split(",") if b.strip()]
    except ValueError:
        raise RecipeError(f"--buckets {buckets!r} is not a list of integers", hint="e.g. --buckets 1,16,256") from None
    console = stderr_console()
    reporter = RichReporter(console, quiet=quiet)
    target_list = parse_targets(targets)
    from tfcompile.runtime.measure import gpu_measurer  # lazy: the runtime package imports torch and triton

    result = tune_artifact(artifact, target_list, buckets=bucket_list, only=kernels,
                           measurer=gpu_measurer(target_list, measure), reporter=reporter)
    reporter.task("", None)  # stop the progress bar
    if result.report_dropped:  # the page showed the old manifest: a new one, recorded in the new manifest
        embed_report(artifact)
    for w in result.warnings:
        reporter.warn(w)
    if not quiet:
        for table in summary_tables(result.entries, load_kernels()[0]):
            console.print(table)
        console.print(f"tuned {len(result.entries)} problems in {result.seconds:.2f}s; "
                      f"wrote [bold]{artifact}/kernels/tuning.json[/]")
    if as_json:
        emit_json(json_doc(result, artifact))
