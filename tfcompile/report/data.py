"""What the report shows, read from an artifact: its manifest, file sizes, kernel indexes, KV
descriptor, and the evaluation (the manifest's `eval` section, or a `tfcompile eval --json`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tfcompile.artifact.fields import EVAL, TRITON_INDEX as TRITON_FIELDS, check_fields
from tfcompile.artifact.integrity import canonical_digest
from tfcompile.artifact.manifest import load_manifest
from tfcompile.artifact.signing import SIGNATURE
from tfcompile.errors import UserError
from tfcompile.io.bounded import parse_json, read_regular

KV_DESCRIPTOR = "tfcompile/kv_cache.json"
TRITON_INDEX = "kernels/index.json"


@dataclass(frozen=True)
class ReportData:
    name: str  # what the report is about (the source model's name or Hub id)
    manifest: dict
    manifest_digest: str  # the manifest's integrity digest (integrity.sha256), not its file's sha256
    sizes: dict[str, int]  # manifest file (relative path) -> bytes on disk
    kv: dict | None  # tfcompile/kv_cache.json
    triton: dict | None  # kernels/index.json
    evaluation: dict | None  # manifest "eval", merged with an `eval --json` document when given
    signature: dict | None = None  # tfcompile/manifest.sig as read (checked by verify, shown here)


def load(artifact: Path, eval_doc: dict | None = None) -> ReportData:
    artifact = Path(artifact)
    manifest = load_manifest(artifact)
    sizes = {rel: (artifact / rel).stat().st_size for rel in sorted(manifest.get("files", {}))
             if _inside(rel) and (artifact / rel).is_file()}
    evaluation = _merge_eval(manifest.get("eval"), eval_doc)
    triton = _json(artifact / TRITON_INDEX)
    if triton is not None:
        check_fields(triton, TRITON_FIELDS, str(artifact / TRITON_INDEX), "the artifact is damaged or was edited; "
                     "rebuild it with tfcompile quantize")
    return ReportData(model_name(artifact, manifest), manifest, canonical_digest(manifest), sizes,
                      _json(artifact / KV_DESCRIPTOR), triton, evaluation, _json(artifact / SIGNATURE))


def model_name(artifact: Path, manifest: dict) -> str:
    """The model the report is about: its Hub id, else the name its config.json gives it (not a
    path: a cache folder's name says nothing), else the source directory's name."""
    src = manifest.get("source", {})
    hub = src.get("hub") if isinstance(src.get("hub"), dict) else None
    if hub and isinstance(hub.get("repo_id"), str):
        return hub["repo_id"]
    config = _json(artifact / "config.json") or {}
    for key in ("_model_name_or_path", "_name_or_path"):
        name = config.get(key)
        if isinstance(name, str) and name.strip() and not name.startswith((os.sep, ".", "~")):
            return name.strip()  # "SmolLM2 135M ...", or a Hub id ORG/NAME; a local path is not a name
    return str(src.get("name") or artifact.name)


def load_eval_json(path: Path) -> dict:
    """A `tfcompile eval --json` document (for `tfcompile report --eval FILE`)."""
    hint = "give the file `tfcompile eval ... --json > eval.json` wrote"
    doc = parse_json(read_regular(path, "--eval document"), f"--eval {path}", hint=hint)  # bounded, no FIFO
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict) or "gates" not in doc:
        raise UserError(f"--eval {path}: not a `tfcompile eval --json` document (no metrics / gates)",
                        hint=hint)
    check_fields(doc, EVAL, f"--eval {path}", hint, UserError)
    return doc


def _merge_eval(section: dict | None, doc: dict | None) -> dict | None:
    if doc is None:
        return section
    keep = ("ok", "activations", "dtype", "text", "kv_cache", "metrics", "layer_summary", "gates", "layers",
            "layer_kl", "layer_kl_positions", "reference", "tasks", "worst_layers")
    return {**(section or {}), **{k: doc[k] for k in keep if k in doc}}


def _inside(rel: str) -> bool:
    """A manifest path that stays inside the artifact (the manifest is input too)."""
    norm = os.path.normpath(rel)
    return not os.path.isabs(rel) and norm != ".." and not norm.startswith(".." + os.sep) and "\0" not in rel


def _json(path: Path) -> dict | None:
    """An optional JSON object of the artifact: None when absent or not a JSON object. A FIFO,
    a device or a file over 16 MiB is exit 1 naming it (read_regular), never a blocked read."""
    if not os.path.lexists(path):
        return None
    raw = read_regular(path, "artifact file")
    try:
        doc = parse_json(raw, str(path))
    except UserError:  # not JSON, nested too deep: the page goes without it, as before
        return None
    return doc if isinstance(doc, dict) else None


def decoder_layer(module: str) -> int | None:
    """"model.layers.3.mlp.up_proj" -> 3 (None outside the decoder layers)."""
    m = re.search(r"\.layers\.(\d+)\.", module)
    return int(m.group(1)) if m else None


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_order(module: str) -> tuple:
    """Sort key: decoder layer, then q, k, v, o, gate, up, down as a layer computes them."""
    layer, proj = decoder_layer(module), projection(module)
    return (layer is None, layer or 0, PROJECTIONS.index(proj) if proj in PROJECTIONS else len(PROJECTIONS), module)


def projection(module: str) -> str:
    """The colour group of a Linear: q/k/v/o/gate/up/down projection, else "other"."""
    last = module.rsplit(".", 1)[-1]
    return last if last in PROJECTIONS else "other"
