"""`tfcompile report OUT [-o report.html] [--eval eval.json]`: the artifact as one HTML page."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.io.out_policy import check_output
from tfcompile.report import build_report, write_report
from tfcompile.report.data import load_eval_json


@click.command("report")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), help="The HTML file to write "
              "(default: OUT-report.html beside the artifact; '-' for stdout). Replaced if it exists.")
@click.option("--eval", "eval_json", type=click.Path(path_type=Path), help="A `tfcompile eval --json` "
              "document to show (per-Linear output SQNR; KL per layer with eval --layer-kl).")
@click.option("--json", "as_json", is_flag=True, help="Print {ok, output, sha256} on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Nothing on stderr but errors.")
def report_cmd(artifact, out, eval_json, as_json, quiet):
    """Write ARTIFACT's report: summary, per-layer SQNR (and KL) plots, eval gates, formats and
    sizes, kernels and targets, provenance. One self-contained HTML page (no network to view it)."""
    eval_doc = load_eval_json(eval_json) if eval_json is not None else None
    if str(out) == "-":
        sys.stdout.write(build_report(artifact, eval_doc))
        return
    out = out or Path(artifact).absolute().parent / f"{Path(artifact).absolute().name}-report.html"
    check_output(out, [("artifact", artifact)], label="-o")  # not into the artifact, cwd or a Hub cache
    sha = write_report(artifact, out, eval_doc)
    if not quiet:
        stderr_console().print(f"wrote [bold]{out}[/] (open it in a browser; it fetches nothing)")
    if as_json:
        emit_json({"ok": True, "output": str(out), "sha256": sha})
