"""tfcompile/manifest.json: where it lives, how it is read and written.

The manifest is the artifact's record of itself: versions, the recipe, the sha256 of every
source and output file, per-layer figures and what each pass did. It holds no timestamps,
absolute paths or timings, so the same inputs and recipe give a byte-identical artifact.
A run writes it once, after its last pass, from the facts the passes returned (the
`manifest` pass, passes/manifest.py); `tfcompile tune` updates the `files` of a published
artifact with `write_manifest` (atomic). manifest.json is not in its own `files` list.
Every write seals it (tfcompile/artifact/integrity.py: its digest of itself, which verify
checks, and the sha256 of tfcompile/report.html when there is one); a signature
(tfcompile/artifact/signing.py) is made over the bytes written here, so it covers every file.
"""

from __future__ import annotations

import os
from pathlib import Path

from tfcompile.artifact.integrity import SCHEMA_VERSIONS, check_schema, seal
from tfcompile.errors import VerifyError
from tfcompile.io.bounded import load_json
from tfcompile.io.jsonfile import JsonDict, write_json

MANIFEST = "tfcompile/manifest.json"
SCHEMA_VERSION = 1  # the version this tfcompile writes (it reads SCHEMA_VERSIONS)


def has_manifest(path: Path) -> bool:
    """`path` is a tfcompile artifact (it has a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def load_manifest(path: Path) -> JsonDict:
    """The manifest of the artifact at `path`, its schema checked; VerifyError otherwise."""
    mpath = Path(path) / MANIFEST
    if os.path.islink(mpath) or os.path.islink(mpath.parent):
        raise VerifyError(f"{mpath}: the manifest is a symlink", hint="the artifact was tampered with; rebuild it")
    if not mpath.is_file():
        raise VerifyError(f"{mpath}: no manifest; {path} is not a tfcompile artifact",
                          hint="point at the directory `tfcompile quantize -o` wrote")
    # a regular file under 16 MiB, nested at most 64 deep, no 5000-digit integer (io/bounded.py)
    doc = load_json(mpath, "manifest", VerifyError, hint="the artifact is corrupt; rebuild it")
    return check_schema(doc, str(mpath))


def write_manifest(out_dir: Path, doc: JsonDict, report_sha256: str | None = None) -> str:
    """Write OUT/tfcompile/manifest.json sealed (its integrity digest added, and the sha256 of
    tfcompile/report.html when given), atomically (temp file + rename), deterministic JSON;
    returns its sha256. An OSError (disk full, quota, read-only) is a user error naming the file."""
    return write_json(Path(out_dir) / MANIFEST, seal(doc, report_sha256), atomic=True)


__all__ = ["MANIFEST", "SCHEMA_VERSION", "SCHEMA_VERSIONS", "has_manifest", "load_manifest", "write_manifest"]


def kv_cache_text(manifest: JsonDict) -> str:
    """The KV cache an engine runs with this artifact: dtype, scale granularity, engine layout."""
    kv = manifest["scheme"].get("kv_cache")
    if not kv:
        return "not quantized (the engine's default dtype)"
    per = {"tensor": "per tensor", "attn_head": "per KV head"}.get(kv.get("strategy"), kv.get("strategy"))
    text = (f"{kv['dtype']}, {per} k_scale/v_scale in {len(manifest.get('kv_modules', []))} attention modules")
    spec = (manifest.get("layout") or {}).get("spec") or {}
    if spec:
        text += (f"; {spec.get('target')} layout {spec.get('kv_layout')}, {spec.get('block_size')} tokens "
                 f"per page (tfcompile/kv_cache.json)")
    return text
