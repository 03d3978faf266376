"""`tfcompile verify`: check an artifact before it ships.

Checks, each reported by name: manifest schema and its integrity digest; the
signature (checked with --public-key); every manifest path inside the artifact
(no `..`, absolute path or symlink: tfcompile/artifact/tree.py); no unlisted
files or symlinks; sha256 of every file (tfcompile/report.html against the sha256 the
manifest's integrity entry records); shards readable; every quantized layer
present with the dtypes and shapes its scheme implies; config.json values in
range, packed weights unpacking to the shapes it implies, and every parameter
of its architecture present (tfcompile/checkpoint_check.py); scales finite and
non-zero; fused groups (q/k/v, gate/up, expert w1/w3) share one NVFP4 global
scale. Only headers and scale tensors are read; packed weights are never loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tfcompile.artifact.integrity import check_seal, report_digest
from tfcompile.artifact.manifest import load_manifest
from tfcompile.artifact.mixed_config import config_mismatches
from tfcompile.artifact.naming import ct_outputs, layer_scheme
from tfcompile.artifact.shapes import check_against_config
from tfcompile.artifact.signing import check_signature
from tfcompile.artifact.tree import checksum_problems, listed_shards, report_problem, safe_entries, unlisted
from tfcompile.errors import UserError, VerifyError
from tfcompile.io.bounded import load_json
from tfcompile.io.dtypes import torch_dtype_of
from tfcompile.io.jsonfile import JsonDict
from tfcompile.io.safetensors_header import read_header
from tfcompile.schemes import get_scheme


@dataclass
class VerifyReport:
    path: str
    checks: list[dict] = field(default_factory=list)  # {"check", "ok", "detail"}

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)

    def add(self, check: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"check": check, "ok": bool(ok), "detail": detail})

    def failures(self) -> list[dict]:
        return [c for c in self.checks if not c["ok"]]


def verify_artifact(path: Path, *, checksums: bool = True, config_shapes: bool = True,
                    block_scales: bool = True, public_key=None, manifest: JsonDict | None = None) -> VerifyReport:
    """Run the checks. The pipeline's own verify pass turns off the costly ones
    whose evidence it already has: re-hashing files it hashed while writing
    them, reading back per-block scales it checked in memory before writing
    them (`check_scale_tensor` in pack), and building the architecture with
    transformers (2-3 s of imports) for the config checks. It also passes the
    `manifest` the run will write (the file is written after the last pass);
    None reads OUT/tfcompile/manifest.json."""
    path = Path(path)
    doc = load_manifest(path) if manifest is None else manifest
    rep = VerifyReport(str(path))
    rep.add("manifest", True, f"schema {doc['schema_version']}")
    entries = check_files(path, doc, rep, checksums=checksums, public_key=public_key)
    try:
        headers = _headers(listed_shards(path, entries))
    except UserError as e:
        rep.add("shards readable", False, e.message)
        return rep
    rep.add("shards readable", True, f"{len(headers)} tensors")
    scheme = get_scheme(doc["scheme"]["name"])
    _check_layers(path, doc, scheme, headers, rep)
    if config_shapes:
        check_against_config(path, doc, scheme, headers, rep)
    if doc.get("mixed"):
        _check_mixed_config(path, doc, rep)
    scales = _load_scales(headers, block_scales)
    _check_scales(scales, rep)
    _check_groups(doc, scheme, scales, rep)
    if (doc.get("layout") or {}).get("view"):  # --layout: the engine view OUT/<target>/
        _check_view(path, doc, scheme, scales, entries, rep)
    return rep


def check_files(path: Path, doc: dict, rep: VerifyReport, *, checksums: bool = True,
                public_key=None) -> dict[str, str]:
    """The integrity checks (`eval` runs these first): manifest digest, signature, paths, unlisted
    files and symlinks, checksums. Returns the manifest entries that are safe to open."""
    rep.add("manifest integrity", *check_seal(doc))
    rep.add("signature", *check_signature(path, public_key))
    entries, bad = safe_entries(path, doc["files"])
    rep.add("paths", not bad, "; ".join(bad[:5]) or f"{len(entries)} paths inside the artifact")
    extra, links = unlisted(path, doc["files"])
    detail = "; ".join(x for x in (_listing("not in the manifest", extra), _listing("symlinks", links)) if x)
    rep.add("extra files", not detail, detail or "every file is in the manifest")
    if checksums:
        bad = checksum_problems(path, entries)
        rep.add("checksums", not bad, "; ".join(bad[:5]) or f"{len(entries)} files match")
    bad_report = report_problem(path, report_digest(doc))
    if bad_report or report_digest(doc):
        rep.add("report", not bad_report, bad_report or "tfcompile/report.html matches the manifest")
    return entries


def _listing(label: str, items: list[str]) -> str:
    if not items:
        return ""
    more = f" and {len(items) - 10} more" if len(items) > 10 else ""
    return f"{label}: " + ", ".join(items[:10]) + more


def _headers(files: list[Path]) -> dict[str, tuple[Path, torch.dtype, tuple]]:
    """name -> (file, dtype, shape) for every tensor of the given shards (our own header parser)."""
    out = {}
    for f in files:
        for name, info in read_header(f).tensors.items():
            out[name] = (f, _dtype(info.dtype), tuple(info.shape))
    return out


_CODES = {"U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32,
          "BF16": torch.bfloat16, "F16": torch.float16}


def _dtype(code: str):
    return _CODES.get(code, code)


def _check_mixed_config(path: Path, doc: dict, rep: VerifyReport) -> None:
    """Mixed precision: config.json's config groups name every layer once, with its own scheme."""
    try:
        qc = load_json(path / "config.json", "config.json")["quantization_config"]
    except (UserError, KeyError, TypeError) as e:
        rep.add("mixed-precision config groups", False, f"config.json unreadable ({e})")
        return
    bad = config_mismatches(qc, doc.get("layers", []))
    rep.add("mixed-precision config groups", not bad, "; ".join(bad[:5]) or
            f"{len(qc.get('config_groups', {}))} groups cover {len(doc.get('layers', []))} layers")


def _check_layers(path, doc, scheme, headers, rep) -> None:
    bad = []
    for layer in doc.get("layers", []):
        n, k = layer["shape"]
        for spec in ct_outputs(layer_scheme(layer, scheme), layer["module"], n, k, torch.bfloat16):
            got = headers.get(spec.name)
            if got is None:
                bad.append(f"{spec.name}: missing")
                continue
            want_dtype = spec.dtype if spec.dtype != torch.bfloat16 else got[1]  # model-dtype scales
            if got[1] != want_dtype or got[2] != spec.shape:
                bad.append(f"{spec.name}: {got[1]} {list(got[2])}, expected {want_dtype} {list(spec.shape)}")
    for attn in doc.get("kv_modules", []):
        bad += [f"{attn}.{k}: missing" for k in ("k_scale", "v_scale") if f"{attn}.{k}" not in headers]
    rep.add("layers present", not bad, "; ".join(bad[:5]) or f"{len(doc.get('layers', []))} layers, "
            f"{len(doc.get('kv_modules', []))} KV-cache scale pairs")


SCALE_SUFFIXES = ("weight_scale", "weight_global_scale", "input_global_scale", "input_scale",
                  "k_scale", "v_scale")


def _load_scales(headers: dict, block_scales: bool) -> dict[str, torch.Tensor]:
    """Every scale tensor (without per-block ones unless asked), one `pread` each.

    Not `safe_open(...).get_tensor`: it maps the whole file and faulted in all
    of a freshly written (O_DIRECT, so uncached) 2.5 GB shard to hand out
    ~1 MB of scales (0.5-0.65 s inside `quantize`)."""
    by_file: dict[Path, list[str]] = {}
    for name, (f, _, shape) in headers.items():
        small = len(shape) <= 1 or shape[-1] == 1  # per tensor / per channel
        if name.endswith(SCALE_SUFFIXES) and (block_scales or small):
            by_file.setdefault(f, []).append(name)
    out = {}
    for f, names in by_file.items():
        head = read_header(f)
        with open(f, "rb", buffering=0) as fh:
            out.update({n: _pread_tensor(fh.fileno(), head, n) for n in names})
    return out


def _pread_tensor(fd: int, head, name: str) -> torch.Tensor:
    info = head.tensors[name]
    dtype = torch_dtype_of(info.dtype)
    raw = bytearray(os.pread(fd, info.nbytes, head.data_start + info.offsets[0]))
    if len(raw) != info.nbytes:
        raise VerifyError(f"{head.file}: tensor {name!r} is cut short ({len(raw)} of {info.nbytes} bytes)",
                          hint="the artifact is corrupt; rebuild it")
    if not raw:
        return torch.empty(info.shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(info.shape)


def check_scale_tensor(name: str, t: torch.Tensor) -> None:
    """Raise VerifyError if scale tensor `name` is NaN, infinite, zero or negative."""
    why = _bad_scale(t)
    if why:
        raise VerifyError(f"scale tensor {name}: {why}",
                          hint="this is a tfcompile bug if the input weights were finite; please report it")


def _bad_scale(t: torch.Tensor) -> str | None:
    """Why a scale tensor is invalid, or None. Checks bytes, not converted copies.

    The common case (valid) costs one `aminmax` reduction, no temporaries: an
    NVFP4 model's block scales are 1/16 of its weights' elements (0.14 G bytes
    for a 4.5 GB checkpoint), where three masked `any()`s took ~0.7 s.
    """
    if t.numel() == 0:
        return None
    if t.dtype == torch.uint8:  # E8M0: 0xFF is NaN; 2^(e-127) is never zero
        return "E8M0 NaN (0xFF)" if int(t.max()) == 255 else None
    if t.dtype == torch.float8_e4m3fn:  # valid bytes 0x01..0x7E: sign clear, not zero, not NaN (S.1111.111)
        b = t.view(torch.uint8)
        lo, hi = torch.aminmax(b)
        if int(lo) >= 0x01 and int(hi) <= 0x7E:
            return None
        return "not finite" if bool(((b & 0x7F) == 0x7F).any()) else "zero or negative"
    lo, hi = torch.aminmax(t)  # NaN propagates into both
    if float(lo) > 0 and float(hi) < float("inf"):
        return None
    if not bool(torch.isfinite(t).all()):
        return "not finite"
    return "zero or negative"


def _check_scales(scales: dict[str, torch.Tensor], rep: VerifyReport) -> None:
    bad = [f"{n}: {why}" for n, t in sorted(scales.items()) if (why := _bad_scale(t))]
    rep.add("scales finite and non-zero", not bad, "; ".join(bad[:5]) or f"{len(scales)} scale tensors valid")


def _check_groups(doc, scheme, scales, rep) -> None:
    if not any(layer_scheme(la, scheme).shares_global_scale for la in doc.get("layers", [])) \
            and not scheme.shares_global_scale:
        rep.add("fused groups share global scale", True, "not applicable")
        return
    bad = []
    for group in doc.get("groups", []):
        values = {scales[n].float().item() for m in group if (n := f"{m}.weight_global_scale") in scales}
        if len(values) > 1:
            bad.append(f"{', '.join(group)}: {sorted(values)}")
    rep.add("fused groups share global scale", not bad,
            "; ".join(bad[:3]) or f"{len(doc.get('groups', []))} groups")


def _check_view(path: Path, doc: dict, scheme, scales: dict, entries: dict, rep: VerifyReport) -> None:
    """The engine view (tfcompile/layout): every Linear its layout.json lists is present with the
    scheme's shapes, and a fused / gathered Linear's NVFP4 global scale equals each member's in
    the compressed-tensors view (one scale for q/k/v, unified before quantization)."""
    view = (doc["layout"]["view"] or {}).get("dir") if isinstance(doc["layout"]["view"], dict) else None
    if not isinstance(view, str) or f"{view}/layout.json" not in entries:  # only files `paths` found safe
        rep.add("engine view", False, f"layout.view.dir {str(view)[:60]!r}: not a listed directory of the artifact")
        return
    try:
        linears = load_json(path / view / "layout.json", "layout.json")["linears"]
        headers = _headers(listed_shards(path, entries, view))
        bad = []
        for m, x in sorted(linears.items()):
            for spec in ct_outputs(scheme, m, *x["shape"], torch.bfloat16):
                got = headers.get(spec.name)
                if got is None or got[2] != spec.shape:
                    bad.append(f"{view}/{spec.name}: " + ("missing" if got is None else f"shape {list(got[2])}, "
                                                          f"expected {list(spec.shape)}"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError) as e:
        rep.add("engine view", False, f"{view}/layout.json or its shards unreadable ({str(e)[:200]})")
        return
    view_scales = _load_scales(headers, False)  # per-tensor / per-channel ones (pack checked the rest)
    bad += [f"{view}/{n}: {why}" for n, t in sorted(view_scales.items()) if (why := _bad_scale(t))]
    rep.add("engine view layers", not bad, "; ".join(bad[:5]) or f"{view}: {len(linears)} Linears")
    if not scheme.shares_global_scale:
        rep.add("engine view shares global scale", True, "not applicable")
        return
    bad = []
    for m, x in sorted(linears.items()):
        mine = view_scales.get(f"{m}.weight_global_scale")
        members = [scales.get(f"{src}.weight_global_scale") for src in x.get("from", [])]
        values = {float(t.float().item()) for t in [mine] + members if t is not None}
        if len(values) > 1:
            bad.append(f"{view}/{m} vs {', '.join(x['from'])}: {sorted(values)}")
    rep.add("engine view shares global scale", not bad,
            "; ".join(bad[:3]) or f"{sum(1 for x in linears.values() if x.get('from'))} fused/gathered Linears")
