"""`tfcompile report`: an artifact as one self-contained HTML page (page.py), written atomically.

    build_report(artifact, eval_doc=None) -> str     the page
    write_report(artifact, path, eval_doc=None)      -> sha256 of the page written at `path`
    embed_report(artifact)                           -> sha256 of ARTIFACT/tfcompile/report.html

The page quotes the manifest's integrity digest, which does not cover the manifest's
`integrity` entry; `embed_report` records the page's sha256 there (`integrity.report_sha256`),
so verify checks the page and a signature over the manifest covers it.
"""

from __future__ import annotations

from pathlib import Path

from tfcompile.artifact.manifest import load_manifest, write_manifest
from tfcompile.artifact.tree import REPORT_HTML
from tfcompile.io.jsonfile import write_bytes
from tfcompile.report import data, page

IN_ARTIFACT = REPORT_HTML  # quantize --report: beside manifest.json, recorded in its integrity entry


def build_report(artifact: Path, eval_doc: dict | None = None) -> str:
    return page.render(data.load(Path(artifact), eval_doc))


def write_report(artifact: Path, path: Path, eval_doc: dict | None = None) -> str:
    """Write the page to `path` atomically (temp file + rename, mode 0666 minus the umask: the one
    atomic writer of tfcompile/io/atomic.py); returns its sha256."""
    return write_bytes(path, build_report(artifact, eval_doc).encode("utf-8"), atomic=True)


def embed_report(artifact: Path) -> str:
    """Write ARTIFACT/tfcompile/report.html from its manifest, then record the page's sha256 in
    the manifest (rewritten atomically; its digest, which the page quotes, is unchanged)."""
    sha = write_report(artifact, Path(artifact) / IN_ARTIFACT)
    write_manifest(Path(artifact), load_manifest(Path(artifact)), report_sha256=sha)
    return sha


__all__ = ["IN_ARTIFACT", "build_report", "embed_report", "write_report"]
