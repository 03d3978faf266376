"""`tfcompile report`: an artifact as one self-contained HTML page (page.py), written atomically.

    build_report(artifact, eval_doc=None) -> str     the page
    write_report(artifact, path, eval_doc=None)      -> sha256 of the page written at `path`
"""

from __future__ import annotations

from pathlib import Path

from tfcompile.artifact.tree import REPORT_HTML
from tfcompile.io.jsonfile import write_bytes
from tfcompile.report import data, page

IN_ARTIFACT = REPORT_HTML  # quantize --report: beside manifest.json, not in its checksums


def build_report(artifact: Path, eval_doc: dict | None = None) -> str:
    return page.render(data.load(Path(artifact), eval_doc))


def write_report(artifact: Path, path: Path, eval_doc: dict | None = None) -> str:
    """Write the page to `path` atomically (temp file + rename, mode 0666 minus the umask: the one
    atomic writer of tfcompile/io/atomic.py); returns its sha256."""
    return write_bytes(path, build_report(artifact, eval_doc).encode("utf-8"), atomic=True)


__all__ = ["IN_ARTIFACT", "build_report", "write_report"]
