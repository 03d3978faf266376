"""tfcompile/manifest.json: where it lives, how it is read and written.

The manifest is the artifact's record of itself: versions, the recipe, the sha256 of every
source and output file, per-layer figures and what each pass did. It holds no timestamps,
absolute paths or timings, so the same inputs and recipe give a byte-identical artifact.
A run writes it once, after its last pass, from the facts the passes returned (the
`manifest` pass, passes/manifest.py); `tfcompile tune` updates the `files` of a published
artifact with `write_manifest` (atomic). manifest.json is not in its own `files` list.
"""

from __future__ import annotations

import json
from pathlib import Path

from tfcompile.errors import VerifyError
from tfcompile.io.jsonfile import JsonDict, write_json

MANIFEST = "tfcompile/manifest.json"
SCHEMA_VERSION = 1
SCHEMA_VERSIONS = (1,)  # versions this tfcompile reads


def has_manifest(path: Path) -> bool:
    """`path` is a tfcompile artifact (it has a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def load_manifest(path: Path) -> JsonDict:
    mpath = Path(path) / MANIFEST
    if not mpath.is_file():
        raise VerifyError(f"{mpath}: no manifest; {path} is not a tfcompile artifact",
                          hint="point at the directory `tfcompile quantize -o` wrote")
    try:
        doc = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VerifyError(f"{mpath}: manifest is not valid JSON ({e})",
                          hint="the artifact is corrupt; rebuild it") from None
    if not isinstance(doc, dict) or doc.get("schema_version") not in SCHEMA_VERSIONS:
        raise VerifyError(f"{mpath}: unsupported schema_version {doc.get('schema_version')!r}",
                          hint="upgrade tfcompile or rebuild the artifact")
    return doc


def write_manifest(out_dir: Path, doc: JsonDict) -> str:
    """Write OUT/tfcompile/manifest.json atomically (temp file + rename), deterministic JSON;
    returns its sha256."""
    return write_json(Path(out_dir) / MANIFEST, doc, atomic=True)
