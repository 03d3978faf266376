"""Kernel emission: compile each served kernel per target, Linear shape and M bucket ahead of
time and write it into the artifact (the `emit` pass's work, passes/emit.py; imported when it runs).

For each target, each kernel serving the scheme there (tfcompile.tune.registry), each distinct
Linear shape [N, K] and each M bucket, the config comes from the tuning table (else the cost
model's choice), is compiled with Triton (tune/compile.py) and written as
kernels/<target>/<kernel>_<N>x<K>_m<M>.{cubin,ptx,json}, with kernels/tuning.json and
kernels/index.json. Same inputs -> byte-identical files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from tfcompile.errors import RecipeError, TfcompileError
from tfcompile.io.jsonfile import dumps, write_bytes
from tfcompile.schemes import Scheme
from tfcompile.tune.compile import Compiled, FrontendCheck, cache_key, compile_kernel
from tfcompile.tune.hardware import get_target
from tfcompile.tune.registry import load_kernels
from tfcompile.tune.search import Ranker
from tfcompile.tune.shapes import Problem, check_buckets, problems
from tfcompile.tune.table import TABLE, cost_entry, entry_key, load_table, lookup, merge, triton_version

INDEX = "kernels/index.json"


class EmitError(TfcompileError):
    """A kernel could not be compiled with any ranked config (a kernel bug; exit 2)."""


def check_kernels(names, kernels: Mapping) -> None:
    """Every name in `names` (emit.kernels) is a registered kernel."""
    unknown = sorted(set(names) - set(kernels))
    if unknown:
        raise RecipeError(f"emit.kernels: unknown kernel(s) {unknown}",
                          hint="registered: " + (", ".join(kernels) or "none"))


def emit_kernels(out: Path, scheme: Scheme, shapes, cfg, reporter) -> tuple[dict[str, str], dict]:
    """Write every kernel file; returns (relative path -> sha256, stats). `cfg`: the emit pass's
    config (targets, buckets, kernels, tuning, ptx)."""
    kernels, warnings = load_kernels()
    for w in warnings:
        reporter.warn(w)
    check_kernels(cfg.kernels, kernels)
    probs, served = problems(scheme, [tuple(s) for s in shapes], cfg.targets, check_buckets(cfg.buckets),
                             kernels, cfg.kernels)
    for target, s in served.items():
        if s.warn:
            reporter.warn(f"emit {target}: {s.note}")
    src = Path(cfg.tuning) if cfg.tuning else out / TABLE
    given = load_table(src) if src.is_file() else None
    triton = triton_version()
    emitter = _Emitter(out, kernels, given, triton, cfg.ptx)
    reporter.task("emit kernels", len(probs))
    for p in probs:
        emitter.emit(p, scheme.name)
        reporter.advance(1, p.key)
    files = emitter.finish(served, scheme.name)
    stats = {"targets": list(cfg.targets), "kernels": len(probs), "compiled": len(emitter.cache),
             "files": len(files), "fallbacks": emitter.fallbacks,
             "from_table": emitter.from_table}
    return files, stats


class _Emitter:
    """Compiles problems (one compile per distinct kernel/shape/config/target) and writes files."""

    def __init__(self, out: Path, kernels: Mapping, table: dict | None, triton: str, ptx: bool):
        self.out, self.kernels, self.table, self.triton, self.ptx = out, kernels, table, triton, ptx
        self.ranker = Ranker(check=FrontendCheck())
        self.cache: dict[str, object] = {}
        self.files: dict[str, str] = {}
        self.used: dict[str, dict] = {}  # tuning-table entries used, by key
        self.index: list[dict] = []
        self.fallbacks = 0
        self.from_table = 0

    def emit(self, p: Problem, scheme: str) -> None:
        kdef = self.kernels[p.kernel]
        entry = self._entry(p)
        compiled, cfg, failed = self._compile_first(kdef, p, entry)
        chosen = {k: entry[k] for k in ("method", "predicted_us", "measured_us") if k in entry}
        chosen["table_key"] = entry_key(p, self.triton)
        if failed:
            chosen["fallback_from"] = failed
            self.fallbacks += 1
        doc = _launch_doc(kdef, p, scheme, cfg, compiled, chosen, self.triton)
        if int(cfg.get("SPLIT_K", 1)) > 1 and kdef.followup:
            doc["followup"] = self._followup(kdef.followup, p, cfg, scheme)
        self._write(p, p.stem, compiled, doc)

    def _followup(self, name: str, p: Problem, cfg: dict, scheme: str) -> dict:
        """The kernel run after a split-K GEMM (e.g. splitk_reduce: sums the fp32 partials),
        compiled for the same shape and SPLIT_K; written as <gemm stem>.<name>.{cubin,ptx,json}."""
        fdef = self.kernels[name]
        fcfg = {**fdef.default_config, "SPLIT_K": int(cfg["SPLIT_K"])}
        cap = get_target(p.target).capability
        key = cache_key(name, p.n, p.k, fcfg, cap)
        if key not in self.cache:
            self.cache[key] = compile_kernel(fdef, p.n, p.k, fcfg, cap)
        stem = f"{p.stem}.{name}"
        fp = Problem(p.target, name, p.n, p.k, p.m)
        self._write(fp, stem, self.cache[key], _launch_doc(fdef, fp, scheme, fcfg, self.cache[key],
                                                             {"method": "follows " + p.kernel}, self.triton))
        return {"kernel": name, "file": stem}

    def _entry(self, p: Problem) -> dict:
        e = lookup(self.table, p, self.triton)
        if e is not None:
            self.from_table += 1
        else:
            kdef = self.kernels[p.kernel]
            e = cost_entry(self.ranker.rank(kdef, p), self.triton, kdef.default_config)
        self.used[entry_key(p, self.triton)] = e
        return e

    def _compile_first(self, kdef, p: Problem, entry: dict):
        """Compile the entry's config, else its runner-ups in order; (compiled, config, failed configs)."""
        cap = get_target(p.target).capability
        failed, errors = [], []
        for cfg in [entry["config"]] + [r["config"] for r in entry.get("runner_up", [])]:
            key = cache_key(p.kernel, p.n, p.k, cfg, cap)
            try:
                if key not in self.cache:
                    self.cache[key] = compile_kernel(kdef, p.n, p.k, cfg, cap)
                return self.cache[key], cfg, failed
            except Exception as e:  # noqa: BLE001 - Triton raises many types; try the next config
                failed.append(cfg)
                errors.append(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
        raise EmitError(f"{p.key}: no ranked config compiles ({'; '.join(errors[:2])})",
                        hint=f"a kernel bug; leave it out with --set emit.kernels=[...] (not {p.kernel})")

    def _write(self, p: Problem, stem: str, compiled: Compiled, doc: dict) -> None:
        blobs = {".cubin": compiled.cubin, ".json": dumps(doc)}
        if self.ptx:
            blobs[".ptx"] = compiled.ptx.encode()
        for suffix, data in blobs.items():
            self.files[stem + suffix] = write_bytes(self.out / (stem + suffix), data)
        self.index.append({"file": stem, "kernel": p.kernel, "kind": doc["kind"], "target": p.target,
                           "n": p.n, "k": p.k, "m_bucket": p.m})

    def finish(self, served: Mapping, scheme: str) -> dict[str, str]:
        """Write the tuning table used and the index; returns every file's sha256."""
        self.files[TABLE] = write_bytes(self.out / TABLE, dumps(merge(None, self.used)))  # this artifact's only
        index = {"schema_version": 1, "scheme": scheme, "triton": self.triton,
                 "targets": {t: {"gemm": list(s.gemm), "act_quant": list(s.act_quant), "note": s.note}
                             for t, s in sorted(served.items())},
                 "kernels": sorted(self.index, key=lambda d: d["file"])}
        self.files[INDEX] = write_bytes(self.out / INDEX, dumps(index))
        return dict(sorted(self.files.items()))


def _launch_doc(kdef, p: Problem, scheme: str, cfg: dict, c: Compiled, chosen: dict, triton: str) -> dict:
    """Everything a runtime needs to launch the cubin, as JSON."""
    md = c.metadata
    return {
        "kernel": p.kernel, "kind": kdef.kind, "scheme": scheme, "target": p.target,
        "capability": get_target(p.target).capability, "n": p.n, "k": p.k, "m_bucket": p.m, "entry": c.name,
        "config": dict(cfg), "num_warps": md.get("num_warps"), "num_stages": md.get("num_stages"),
        "shared_bytes": md.get("shared"), "tmem_cols": md.get("tmem_size") or 0,
        "grid": grid_formula(kdef, p, cfg), "signature": c.signature, "constexprs": c.constexprs,
        "arg_order": list(c.signature),  # the kernel's parameters in call order (JSON keys are sorted)
        "options": c.options, "triton": triton, "chosen_by": chosen, "triton_metadata": md,
    }


def grid_formula(kdef, p: Problem, cfg: dict) -> dict:
    """The launch grid as a function of M: each dim `c` or `c * cdiv(M, b)`, found by checking
    kdef.grid at sample M; dims of no such form are "?" and the samples are given."""
    bases = sorted({int(cfg.get("BLOCK_M", 1)), 1, 64, 128, 256})
    samples = sorted({1, 2, 63, 65, 127, 129, 255, 257, 1000, 4096, 4097, *bases})
    at = {m: tuple(kdef.grid(m, p.n, p.k, cfg)) for m in samples}
    dims = [_dim_formula({m: g[i] for m, g in at.items()}, bases) for i in range(len(at[1]))]
    tiles = {k: v for k, v in sorted(cfg.items()) if k.startswith("BLOCK_") or k in ("SPLIT_K", "GROUP_M")}
    doc = {"formula": f"({', '.join(dims)}{',' if len(dims) == 1 else ''})", "tiles": tiles,
           "at_bucket": list(kdef.grid(p.m, p.n, p.k, cfg))}
    if "?" in dims:
        doc["samples"] = {str(m): list(g) for m, g in at.items()}
    return doc


def _dim_formula(vals: Mapping[int, int], bases: list[int]) -> str:
    if len(set(vals.values())) == 1:
        return str(vals[1])
    for b in bases:
        c = vals[b]  # cdiv(b, b) == 1
        if all(v == c * math.ceil(m / b) for m, v in vals.items()):
            return f"cdiv(M, {b})" if c == 1 else f"{c} * cdiv(M, {b})"
    return "?"

