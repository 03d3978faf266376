"""`tfcompile verify ARTIFACT`: every check, exit 1 when one fails."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.artifact.signing import load_public_key
from tfcompile.artifact.verify import verify_artifact
from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.cli.sign_cmd import public_key_option
from tfcompile.cli.tables import verify_table


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report on stdout.")
@public_key_option
def verify(artifact: Path, as_json: bool, public_key: Path | None) -> None:
    """Check paths, files, checksums, signature, layers, shapes, scales and shared global scales (exit 1 on failure)."""
    report = verify_artifact(artifact, public_key=load_public_key(public_key) if public_key else None)
    if as_json:
        emit_json({"ok": report.ok, "path": report.path, "checks": report.checks})
    else:
        stderr_console().print(verify_table(report))
    if not report.ok:
        raise SystemExit(1)
