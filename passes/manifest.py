"""`manifest`: the artifact's record of itself, tfcompile/manifest.json, written once.

The document is assembled by `manifest_doc(ctx)` (tfcompile/manifest_doc.py) from the
facts passes returned. The pass records it as `ctx.manifest` where it is scheduled (verify
and eval read it); it is written once, after the last pass (`finish`), so passes
scheduled after it (emit_cutlass, verify, eval) add facts instead of rewriting the file.
It holds no timestamps, absolute paths or timings, so the same inputs and recipe give a
byte-identical artifact (tfcompile/artifact/manifest.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfcompile.artifact.manifest import MANIFEST, write_manifest
from tfcompile.pipeline.context import Context
from tfcompile.manifest_doc import manifest_doc
from tfcompile.pipeline.passes import PassResult, register_pass


@dataclass(frozen=True)
class ManifestConfig:
    pass


def _write(ctx: Context) -> Context:
    """After the last pass: write the manifest of every fact, once."""
    doc = manifest_doc(ctx)
    write_manifest(Path(ctx.out_dir), doc)
    return ctx.with_(manifest=doc)


@register_pass("manifest", config=ManifestConfig,
               requires=("source", "model", "plan", "program", "artifact", "out_dir"), produces=("manifest",),
               finish=_write, ranks="root")
def manifest(ctx, cfg: ManifestConfig, reporter) -> PassResult:
    """Record versions, the recipe, checksums and per-layer figures (written after the last pass)."""
    return PassResult(ctx.with_(manifest=manifest_doc(ctx)), {"path": MANIFEST})
