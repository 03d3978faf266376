"""`tfcompile inspect ARTIFACT`: the manifest, as tables or JSON."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.artifact.manifest import load_manifest
from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.cli.tables import layers_table, summary_table


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest on stdout.")
@click.option("--layers/--no-layers", default=True, help="Show the per-layer table.")
def inspect(artifact: Path, as_json: bool, layers: bool) -> None:
    """Show an artifact's manifest: format, sizes, per-layer SQNR."""
    doc = load_manifest(artifact)
    if as_json:
        emit_json(doc)
        return
    console = stderr_console()
    console.print(summary_table(doc))
    if layers:
        console.print(layers_table(doc))
