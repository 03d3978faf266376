"""A staged artifact that missed a quality gate, kept beside OUT for debugging: OUT.rejected/.

`quantize --eval` publishes nothing at OUT when a gate is missed. The eval pass hands the
manifest the artifact would have had (its "eval" section holding the failed gates and the worst
layers) with its error; `keep_rejected` writes that manifest into the staging directory, so the
files are complete and `tfcompile verify / eval / report / inspect` work on them, and renames the
directory to OUT.rejected (a previous OUT.rejected is replaced only when it is itself an artifact).
It is never signed: nothing at OUT.rejected is meant to ship.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tfcompile.artifact.manifest import has_manifest, write_manifest

SUFFIX = ".rejected"


def rejected_path(out: Path) -> Path:
    out = Path(out).absolute()
    return out.with_name(out.name + SUFFIX)


def keep_rejected(staging: Path, out: Path, manifest: dict) -> Path | None:
    """Write `manifest` into `staging` and move it to OUT.rejected; the path, or None when a
    non-artifact is in the way (it is left alone and the staging directory is deleted as usual)."""
    target = rejected_path(out)
    if os.path.lexists(target):
        if not (target.is_dir() and not target.is_symlink() and has_manifest(target)):
            return None
        shutil.rmtree(target)
    write_manifest(Path(staging), manifest)
    os.rename(staging, target)
    return target
