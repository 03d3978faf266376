"""What a manifest must look like, and its digest of itself.

`check_schema(doc, where)` validates the types of every manifest field that
`verify`, `inspect`, `tune` and `eval` read, so a damaged or hostile manifest
is a VerifyError naming the field (exit 1), never a traceback.

`seal(doc)` adds `"integrity": {"sha256": ...}`, the sha256 of the canonical
JSON of the rest of the document (sorted keys, no whitespace). Every writer
of the manifest seals it (tfcompile/artifact/manifest.py `write_manifest`), so `verify`
reports a manifest edited by hand or by a tool that did not recompute it.
The digest is not a secret: whoever edits the manifest *and* recomputes it
is caught only by a signature (tfcompile/artifact/signing.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tfcompile.artifact.fields import MANIFEST as MANIFEST_FIELDS, check_fields
from tfcompile.errors import RecipeError, VerifyError
from tfcompile.schemes import get_scheme

SCHEMA_VERSIONS = (1,)
KEY = "integrity"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def canonical_digest(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(doc: dict, report_sha256: str | None = None) -> dict:
    """`doc` with its integrity digest (any old one replaced). `report_sha256`: the sha256 of
    tfcompile/report.html when the artifact has one; kept beside the digest, outside what it
    covers, because the page quotes the digest (so the manifest's own bytes, which a signature
    covers, record the report, and the digest the page shows does not depend on the page)."""
    entry = {"sha256": canonical_digest(doc)}
    if report_sha256 is not None:
        entry["report_sha256"] = report_sha256
    return {**{k: v for k, v in doc.items() if k != KEY}, KEY: entry}


def report_digest(doc: dict) -> str | None:
    """The sha256 of tfcompile/report.html the manifest records, or None."""
    entry = doc.get(KEY)
    value = entry.get("report_sha256") if isinstance(entry, dict) else None
    return value if isinstance(value, str) else None


def check_seal(doc: dict) -> tuple[bool, str]:
    """(ok, detail) for the manifest's digest of itself."""
    entry = doc.get(KEY)
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        return False, "the manifest has no integrity digest: it was written by hand or by an old tool"
    if entry["sha256"] != canonical_digest(doc):
        return False, "the manifest was edited after tfcompile wrote it (its integrity digest does not match)"
    return True, "the manifest matches its integrity digest"


_SUMMARY = ("quantized_linears", "bytes_in", "bytes_out", "compression_ratio", "worst_sqnr_db")


def _number(v: Any) -> bool:
    """A JSON number or null (not a bool)."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def check_schema(doc: Any, where: str) -> dict:
    """`doc` if every field tools read has the right type; else VerifyError naming the field."""
    def bad(field: str, want: str) -> VerifyError:
        return VerifyError(f"{where}: manifest field {field} is not {want}",
                           hint="the artifact is damaged or was edited; rebuild it with tfcompile quantize")

    if not isinstance(doc, dict):
        raise bad("(top level)", "a JSON object")
    v = doc.get("schema_version")
    if type(v) is not int or v not in SCHEMA_VERSIONS:
        raise VerifyError(f"{where}: unsupported manifest schema_version {v!r}",
                          hint="upgrade tfcompile or rebuild the artifact")
    files = doc.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(h, str) and _HEX64.fullmatch(h)
                                              for k, h in files.items()):
        raise bad("files", "an object of path -> sha256 (64 hex digits)")
    scheme = doc.get("scheme")
    if not isinstance(scheme, dict) or not isinstance(scheme.get("name"), str):
        raise bad("scheme", "an object with a name")
    try:
        get_scheme(scheme["name"])
    except RecipeError:
        raise bad("scheme.name", "a known format") from None
    if not all(isinstance(scheme.get(k), str) for k in ("weight", "granularity")):
        raise bad("scheme", "an object with name, weight and granularity")
    summary = doc.get("summary")
    if not isinstance(summary, dict) or not all(_number(summary.get(k)) for k in _SUMMARY):
        raise bad("summary", "an object of numbers (" + ", ".join(_SUMMARY) + ")")
    layers = doc.get("layers", [])
    if not isinstance(layers, list):
        raise bad("layers", "a list")
    for i, la in enumerate(layers):
        shape = la.get("shape") if isinstance(la, dict) else None
        if not (isinstance(la, dict) and isinstance(la.get("module"), str) and isinstance(la.get("format"), str)
                and _number(la.get("sqnr_db")) and isinstance(shape, list) and len(shape) == 2
                and all(type(d) is int and 0 < d < 1 << 31 for d in shape)):
            raise bad(f"layers[{i}]", "an object with module, format, sqnr_db and a [N, K] shape")
    for field in ("groups",):
        val = doc.get(field, [])
        if not isinstance(val, list) or not all(isinstance(g, list) and all(isinstance(m, str) for m in g)
                                                for g in val):
            raise bad(field, "a list of lists of module names")
    for field in ("kv_modules", "ignore", "views"):
        val = doc.get(field, [])
        if not isinstance(val, list) or not all(isinstance(m, str) for m in val):
            raise bad(field, "a list of strings")
    for field in ("summary", "layout", "eval", "source", "recipe"):
        if field in doc and doc[field] is not None and not isinstance(doc[field], dict):
            raise bad(field, "an object")
    check_fields(doc, MANIFEST_FIELDS, f"{where}: manifest",  # what report and inspect read
                 "the artifact is damaged or was edited; rebuild it with tfcompile quantize")
    return doc
