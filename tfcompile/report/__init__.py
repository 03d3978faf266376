"""`tfcompile report`: an artifact as one self-contained HTML page (page.py), written atomically.

    build_report(artifact, eval_doc=None) -> str     the page
    write_report(artifact, path, eval_doc=None)      -> sha256 of the page written at `path`
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from tfcompile.io.atomic import current_umask
from tfcompile.io.oserrors import write_error
from tfcompile.report import data, page

IN_ARTIFACT = "tfcompile/report.html"  # quantize --report: beside manifest.json, not in its checksums


def build_report(artifact: Path, eval_doc: dict | None = None) -> str:
    return page.render(data.load(Path(artifact), eval_doc))


def write_report(artifact: Path, path: Path, eval_doc: dict | None = None) -> str:
    """Write the page to `path` (temp file + rename, mode 0666 minus the umask); returns its sha256."""
    blob = build_report(artifact, eval_doc).encode("utf-8")
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
        raise write_error(path, e) from e
    return hashlib.sha256(blob).hexdigest()


__all__ = ["IN_ARTIFACT", "build_report", "write_report"]
