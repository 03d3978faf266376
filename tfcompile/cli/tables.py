"""Rich tables for people (stderr): run summary and per-layer figures."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from tfcompile.artifact.manifest import kv_cache_text


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def summary_table(manifest: dict) -> Table:
    s, scheme = manifest["summary"], manifest["scheme"]
    t = Table(title="tfcompile artifact", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("format", escape(f"{scheme['name']} ({scheme['weight']}, {scheme['granularity']})"))
    t.add_row("quantized linears", str(s["quantized_linears"]))
    t.add_row("ignored linears", str(len(manifest.get("ignore", []))))
    t.add_row("bytes before", _mb(s["bytes_in"]))
    t.add_row("bytes after", _mb(s["bytes_out"]))
    t.add_row("compression", f"{s['compression_ratio']}x" if s["compression_ratio"] else "-")
    t.add_row("worst weight SQNR", "-" if s["worst_sqnr_db"] is None else f"{s['worst_sqnr_db']:.2f} dB")
    t.add_row("KV cache", kv_cache_text(manifest))
    t.add_row("views", escape(", ".join(manifest.get("views", []))))
    if (hub := manifest.get("source", {}).get("hub")):
        t.add_row("source", escape(f"{hub['repo_id']} @ {hub['commit'][:12]} (Hugging Face Hub)"))
    return t


def layers_table(manifest: dict, limit: int | None = None) -> Table:
    t = Table(title="layers")
    for col in ("module", "format", "shape", "SQNR dB"):
        t.add_column(col, justify="right" if col == "SQNR dB" else "left")
    rows = manifest.get("layers", [])
    for layer in rows[:limit] if limit else rows:
        sq = layer.get("sqnr_db")
        t.add_row(escape(layer["module"]), escape(layer["format"]), "x".join(map(str, layer["shape"])),
                  "inf" if sq is None else f"{sq:.2f}")
    return t


def verify_table(report) -> Table:
    t = Table(title=f"verify {report.path}")
    t.add_column("check")
    t.add_column("result")
    t.add_column("detail")
    for c in report.checks:
        t.add_row(c["check"], "[green]ok[/]" if c["ok"] else "[red]FAILED[/]", escape(c["detail"]))  # names from the artifact
    return t
