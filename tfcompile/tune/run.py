"""`tfcompile tune ARTIFACT`: tune every kernel the artifact needs and store the table.

Reads the manifest's layers, finds the kernels that serve its scheme on each
target (registry.serving), ranks each problem's configs with the cost model
and, given a `Measurer` for a GPU present here (tfcompile/runtime/measure.py
`gpu_measurer`: the caller decides), measures the best ranked configs of its
target with triton.testing.do_bench. The table is written atomically to
OUT/kernels/tuning.json and its sha256 recorded in the manifest's file list
(manifest rewritten atomically too: `tfcompile tune` updates a published artifact).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Protocol

from tfcompile.artifact.manifest import load_manifest, write_manifest
from tfcompile.artifact.signing import drop_stale_signature
from tfcompile.artifact.tree import REPORT_HTML
from tfcompile.errors import UserError
from tfcompile.io.jsonfile import dumps, write_bytes
from tfcompile.io.out_policy import check_in_place
from tfcompile.schemes import get_scheme
from tfcompile.tune.compile import FrontendCheck
from tfcompile.tune.registry import Serving, load_kernels
from tfcompile.tune.search import KEEP_MEASURED, Choice, Ranker
from tfcompile.tune.shapes import DEFAULT_BUCKETS, Problem, check_buckets, layer_shapes, problems
from tfcompile.tune.table import TABLE, cost_entry, entry_key, load_table, measured_entry, merge, triton_version


class Measurer(Protocol):
    """Times a problem's ranked configs on the local GPU (tfcompile/runtime/measure.py)."""
    target: str  # the GPU's target: only its problems are measured

    def __call__(self, kdef, c: Choice) -> tuple[list[tuple[dict, float]], str]: ...


@dataclass
class TuneResult:
    table: dict  # the whole table as written (or computed)
    entries: dict[str, dict]  # this run's entries, by key
    served: dict[str, Serving]  # target -> kernels serving the scheme
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sha256: str | None = None  # of the table written
    report_dropped: bool = False  # the artifact's report.html showed the old manifest: removed


def choose(probs: Iterable[Problem], kernels: Mapping, triton: str, *, measurer: Measurer | None = None,
           reporter=None) -> dict[str, dict]:
    """Table entries for `probs`: measured on this GPU for the measurer's target, else cost model."""
    check = FrontendCheck()
    ranker, measured = Ranker(check=check), Ranker(KEEP_MEASURED, check=check)
    target = measurer.target if measurer is not None else None
    out = {}
    for p in probs:
        kdef = kernels[p.kernel]
        c: Choice = (measured if p.target == target else ranker).rank(kdef, p)
        if p.target == target and c.ranked:
            times, device = measurer(kdef, c)
            out[entry_key(p, triton)] = measured_entry(c, triton, times, device) if times \
                else cost_entry(c, triton, kdef.default_config)
        else:
            out[entry_key(p, triton)] = cost_entry(c, triton, kdef.default_config)
        if reporter is not None:
            reporter.advance(1, p.key)
    return out


def plan_problems(manifest: Mapping, targets: Iterable[str], buckets: Iterable[int], kernels: Mapping,
                  only: Iterable[str] = ()) -> tuple[list[Problem], dict[str, Serving]]:
    """Problems of an artifact's manifest: its layers' shapes x targets x buckets x serving kernels."""
    scheme = get_scheme(manifest["scheme"]["name"])
    shapes = [s for group in layer_shapes(manifest.get("layers", [])).values() for s in group]
    return problems(scheme, shapes, targets, buckets, kernels, only)


def tune_artifact(path: Path, targets: tuple[str, ...], *, buckets: Iterable[int] = DEFAULT_BUCKETS,
                  only: Iterable[str] = (), measurer: Measurer | None = None, reporter=None) -> TuneResult:
    """Tune, write OUT/kernels/tuning.json (merged with what is there) and record it in the manifest.
    With a `measurer`, the problems of its target are timed on the local GPU."""
    t0 = time.perf_counter()
    path = Path(path)
    check_in_place(path, TABLE)  # never into a Hugging Face cache
    manifest = load_manifest(path)
    kernels, warnings = load_kernels()
    only = tuple(only)
    unknown = sorted(set(only) - set(kernels))
    if unknown:
        raise UserError(f"unknown kernel(s) {unknown}", hint="registered: " + (", ".join(kernels) or "none"))
    probs, served = plan_problems(manifest, targets, check_buckets(buckets), kernels, only)
    warnings += [f"{t}: {s.note}" for t, s in served.items() if s.warn]
    if reporter is not None:
        reporter.task("tune", len(probs))
    triton = triton_version()
    entries = choose(probs, kernels, triton, measurer=measurer, reporter=reporter)
    table_path = path / TABLE
    old = load_table(table_path) if table_path.exists() else None
    doc = merge(old, entries)
    digest = write_bytes(table_path, dumps(doc), atomic=True)
    manifest = dict(manifest, files=dict(sorted({**manifest.get("files", {}), TABLE: digest}.items())))
    write_manifest(path, manifest)  # a report's sha256 is dropped with the old seal: so is the page
    dropped = os.path.lexists(path / REPORT_HTML)
    if dropped:
        (path / REPORT_HTML).unlink()
    warnings += drop_stale_signature(path)
    warnings += _stale_kernels(path, doc, triton)
    return TuneResult(doc, entries, served, warnings, time.perf_counter() - t0, digest, dropped)


def _stale_kernels(path: Path, table: Mapping, triton: str) -> list[str]:
    """Emitted kernels (kernels/<target>/*.json) whose config differs from the table now."""
    out = []
    for f in sorted((path / "kernels").glob("sm_*/*.json")):
        doc = json.loads(f.read_text())
        p = Problem(doc["target"], doc["kernel"], doc["n"], doc["k"], doc["m_bucket"])
        e = table["entries"].get(entry_key(p, triton))
        if e is not None and e["config"] != doc["config"]:
            out.append(f"{f.relative_to(path)} was emitted with another config; rebuild with "
                       f"`tfcompile quantize ... --target {doc['target']} --set emit.tuning=...`")
    return out[:5]
