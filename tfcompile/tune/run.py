"""`tfcompile tune ARTIFACT`: tune every kernel the artifact needs and store the table.

Reads the manifest's layers, finds the kernels that serve its scheme on each
target (registry.serving), ranks each problem's configs with the cost model
and, for the target of a GPU present here (when measuring is on), measures
the best ranked configs with triton.testing.do_bench. The table is written
atomically to OUT/kernels/tuning.json and its sha256 recorded in the
manifest's file list (manifest rewritten atomically too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from tfcompile.errors import UserError
from tfcompile.schemes import get_scheme
from tfcompile.tune.registry import Serving, load_kernels
from tfcompile.tune.search import KEEP_MEASURED, Choice, Ranker
from tfcompile.tune.shapes import DEFAULT_BUCKETS, Problem, check_buckets, layer_shapes, problems
from tfcompile.tune.table import (TABLE, cost_entry, dumps, entry_key, load_table, measured_entry, merge,
                                  triton_version, write_atomic)


@dataclass
class TuneResult:
    table: dict  # the whole table as written (or computed)
    entries: dict[str, dict]  # this run's entries, by key
    served: dict[str, Serving]  # target -> kernels serving the scheme
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sha256: str | None = None  # of the table written


def choose(probs: Iterable[Problem], kernels: Mapping, triton: str, *, measure_target: str | None = None,
           reporter=None) -> dict[str, dict]:
    """Table entries for `probs`: measured on this GPU for `measure_target`, else cost model."""
    from tfcompile.tune.compile import FrontendCheck

    check = FrontendCheck()
    ranker, measured = Ranker(check=check), Ranker(KEEP_MEASURED, check=check)
    out = {}
    for p in probs:
        kdef = kernels[p.kernel]
        c: Choice = (measured if p.target == measure_target else ranker).rank(kdef, p)
        if p.target == measure_target and c.ranked:
            from tfcompile.tune.measure import measure_choice

            times, device = measure_choice(kdef, c)
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
                  only: Iterable[str] = (), measure: bool | None = None, reporter=None) -> TuneResult:
    """Tune, write OUT/kernels/tuning.json (merged with what is there) and record it in the manifest."""
    from tfcompile.artifact.signing import drop_stale_signature
    from tfcompile.artifact.verify import load_manifest
    from tfcompile.passes.manifest import write_manifest

    t0 = time.perf_counter()
    path = Path(path)
    manifest = load_manifest(path)
    kernels, warnings = load_kernels()
    only = tuple(only)
    unknown = sorted(set(only) - set(kernels))
    if unknown:
        raise UserError(f"unknown kernel(s) {unknown}", hint="registered: " + (", ".join(kernels) or "none"))
    probs, served = plan_problems(manifest, targets, check_buckets(buckets), kernels, only)
    warnings += [f"{t}: {s.note}" for t, s in served.items() if s.warn]
    gpu_target = _measure_target(measure, targets, warnings)
    if reporter is not None:
        reporter.task("tune", len(probs))
    triton = triton_version()
    entries = choose(probs, kernels, triton, measure_target=gpu_target, reporter=reporter)
    table_path = path / TABLE
    old = load_table(table_path) if table_path.exists() else None
    doc = merge(old, entries)
    digest = write_atomic(table_path, dumps(doc))
    manifest = dict(manifest, files=dict(sorted({**manifest.get("files", {}), TABLE: digest}.items())))
    write_manifest(path, manifest)
    warnings += drop_stale_signature(path)
    warnings += _stale_kernels(path, doc, triton)
    return TuneResult(doc, entries, served, warnings, time.perf_counter() - t0, digest)


def _measure_target(measure: bool | None, targets: tuple[str, ...], warnings: list[str]) -> str | None:
    """The target to measure on: the local GPU's, when asked (True) or by default (None)."""
    if measure is False:
        return None
    from tfcompile.tune.measure import local_target

    target, why = local_target()
    if target is None or target not in targets:
        if measure:
            raise UserError(f"cannot measure: {why or f'this GPU runs {target}, not one of {list(targets)}'}",
                            hint="drop --measure to rank configs with the cost model")
        return None
    return target


def _stale_kernels(path: Path, table: Mapping, triton: str) -> list[str]:
    """Emitted kernels (kernels/<target>/*.json) whose config differs from the table now."""
    import json

    out = []
    for f in sorted((path / "kernels").glob("sm_*/*.json")):
        doc = json.loads(f.read_text())
        p = Problem(doc["target"], doc["kernel"], doc["n"], doc["k"], doc["m_bucket"])
        e = table["entries"].get(entry_key(p, triton))
        if e is not None and e["config"] != doc["config"]:
            out.append(f"{f.relative_to(path)} was emitted with another config; rebuild with "
                       f"`tfcompile quantize ... --target {doc['target']} --set emit.tuning=...`")
    return out[:5]
