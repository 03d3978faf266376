"""`tfcompile export-onnx ARTIFACT -o model.onnx`: ONNX with quantize/dequantize nodes (docs/onnx.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.onnx_export.config import DEFAULT_OPSET, OnnxExportConfig


@click.command("export-onnx")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="The .onnx file to write; external data goes beside it as OUT.data.")
@click.option("--opset", type=int, help="Default-domain opset: 23 (default; FLOAT4E2M1) or newer "
              "(24+: MX scales as FLOAT8E8M0).")
@click.option("--external-data", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Weights in OUT.data: above ~1.9 GiB (auto), always, or never.")
@click.option("--overwrite", is_flag=True, help="Replace OUT (and OUT.data) if they exist.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Nothing on stderr but errors.")
def export_onnx(artifact: Path, out: Path, opset: int | None, external_data: str, overwrite: bool, as_json: bool,
                quiet: bool) -> None:
    """Export ARTIFACT (or a plain checkpoint) as ONNX with quantize/dequantize nodes.

    Prints `SHA256  FILE` per file written on stdout (sha256sum's format), or JSON with --json."""
    # lazy: onnx (~1 s to import) and torch; only this command (and the onnx pass) needs them
    from tfcompile.onnx_export.export import export_to_path
    from tfcompile.onnx_export.source import view_from_path

    view = view_from_path(artifact)
    cfg = OnnxExportConfig(opset=DEFAULT_OPSET if opset is None else opset, external_data=external_data)
    res = export_to_path(view, out, cfg, overwrite=overwrite)
    paths = {name: res.path.parent / name for name in res.files}
    if not quiet:
        fmt = view.scheme.name if view.scheme else "none (float checkpoint)"
        stderr_console().print(f"wrote [bold]{res.path}[/] (format {fmt}, opset {res.opset}, "
                               f"{res.initializer_bytes / 2**20:.1f} MiB of initializers"
                               f"{', external data' if res.external_data else ''}; custom ops: "
                               f"{', '.join(res.custom_ops) or 'none'}) in {res.seconds:.2f}s")
    if as_json:
        emit_json({"ok": True, "output": str(res.path), "format": view.scheme.name if view.scheme else None,
                   **res.to_dict(), "files": {str(paths[n]): sha for n, sha in res.files.items()}})
    else:
        for name, sha in res.files.items():
            sys.stdout.write(f"{sha}  {paths[name]}\n")
