"""CUTLASS emission: generate the artifact's CUTLASS GEMM sources per (target, kernel, config),
compile them with nvcc when the toolchain allows, and write them with their indexes (the
`emit_cutlass` pass's work, passes/emit_cutlass.py, which documents the files; imported when it runs).
"""

from __future__ import annotations

import threading
from pathlib import Path

from tfcompile.errors import RecipeError
from tfcompile.io.jsonfile import JsonDict, dumps, write_bytes
from tfcompile.kernels.cutlass.build import Job, build_all
from tfcompile.kernels.cutlass.configs import KERNELS
from tfcompile.kernels.cutlass.render import entry_names, render, stem
from tfcompile.kernels.cutlass.toolchain import Toolchain, detect, nvcc_flags
from tfcompile.tune import cutlass as tc
from tfcompile.tune.shapes import check_buckets
from tfcompile.tune.table import TABLE, load_table, merge

ABI = ("int run(const void* a, const void* b, const void* sa, const void* sb, const float* alpha, void* d, "
       "int m, int n, int k, int flags, void* workspace, size_t workspace_bytes, void* stream)")
RETURNS = {"0": "ok", "1": "can_implement failed (shape / alignment)", "2": "workspace too small",
           "3": "initialize failed", "4": "launch failed (see *_last_cuda_error)", "5": "no CUDA device"}


def emit_cutlass_kernels(out: Path, scheme: str, shapes: list[tuple[int, int]], cfg,
                         reporter) -> tuple[dict[str, str], JsonDict, dict]:
    """Write sources (and, when compiling, libraries) for format `scheme` and the Linear shapes;
    returns (relative path -> sha256, manifest section, stats). `cfg`: the emit_cutlass pass's config
    (targets, buckets, compile, tuning, slack, jobs)."""
    version = tc.version()
    probs, notes = tc.problems(scheme, shapes, cfg.targets, check_buckets(cfg.buckets))
    for target, note in sorted(notes.items()):
        reporter.warn(f"emit_cutlass {target}: {note}")
    table = _table(out, cfg)
    entries, from_table = tc.choose(probs, table, version)
    entries, dropped = tc.consolidate(entries, probs, version, cfg.slack)
    sources = _sources(probs, entries, version)
    toolchain = detect()
    why_not = "emit_cutlass.compile=never" if cfg.compile == "never" else toolchain.why_not
    if why_not is not None and cfg.compile == "always":
        toolchain.require()
    built = {} if why_not or not sources else _compile(sources, toolchain, cfg.jobs, reporter)
    if why_not and cfg.compile == "auto" and sources:
        reporter.warn(f"emit_cutlass: sources written, not compiled: {why_not}")
    files = _write(out, sources, built, toolchain, why_not)
    files.update(_write_indexes(out, scheme, cfg.targets, probs, entries, notes, version, why_not))
    files.update(_merge_table(out, entries))
    section = {"version": version, "compiled": why_not is None, "why_not": why_not,
               "nvcc": toolchain.version if why_not is None else None,
               "targets": {t: {"sources": sorted(s["stem"] for s in sources.values() if s["target"] == t),
                               "note": notes.get(t, "")} for t in cfg.targets}}
    stats = {"targets": list(cfg.targets), "problems": len(probs), "sources": len(sources),
             "compiled": sum(not b.cached for b in built.values()), "cached": sum(b.cached for b in built.values()),
             "nvcc_s": round(sum(b.seconds for b in built.values() if not b.cached), 1),
             "from_table": from_table, "configs_dropped": dropped, "files": len(files)}
    return files, section, stats


def _table(out: Path, cfg) -> dict | None:
    src = Path(cfg.tuning) if cfg.tuning else out / TABLE
    return load_table(src) if src.is_file() else None


def _sources(probs, entries: dict, version: str) -> dict[tuple, dict]:
    """(target, kernel, config id) -> {"kernel", "target", "config", "stem", "source", "problems"}."""
    out: dict[tuple, dict] = {}
    for p in probs:
        e = entries[tc.entry_key(p, version)]
        kdef, cfg = KERNELS[p.kernel], e["config"]
        key = (p.target, p.kernel, cfg["id"])
        if key not in out:
            out[key] = {"kernel": kdef, "target": p.target, "config": cfg,
                        "stem": f"kernels/{p.target}/cutlass/{stem(kdef, cfg)}", "source": render(kdef, cfg),
                        "problems": []}
        elif out[key]["config"] != cfg:
            raise RecipeError(f"tuning table: two configs named {cfg['id']!r} for {p.kernel} differ",
                              hint="give each distinct config its own id in the table")
        out[key]["problems"].append({"n": p.n, "k": p.k, "m_bucket": p.m})
    return dict(sorted(out.items()))


def _compile(sources: dict, toolchain: Toolchain, jobs: int, reporter) -> dict:
    """Build every source (parallel, cached); (target, kernel, id) -> build.Built."""
    keys = list(sources)
    todo = [Job(sources[k]["stem"].removeprefix("kernels/"), sources[k]["source"],
                sources[k]["kernel"].arch, sources[k]["kernel"].mma) for k in keys]
    lock = threading.Lock()
    reporter.task("compile CUTLASS kernels (nvcc)", len(todo))

    def progress(b) -> None:
        with lock:
            reporter.advance(1, f"{b.name} ({'cached' if b.cached else f'{b.seconds:.0f} s'})")

    return dict(zip(keys, build_all(todo, toolchain, jobs, progress)))


def _write(out: Path, sources: dict, built: dict, toolchain: Toolchain, why_not: str | None) -> dict[str, str]:
    """Source, library (if built) and launch record of every source; relative path -> sha256."""
    files: dict[str, str] = {}
    for key, s in sources.items():
        kdef, cfg, b = s["kernel"], s["config"], built.get(key)
        files[s["stem"] + ".cu"] = _put(out, s["stem"] + ".cu", s["source"].encode())
        if b is not None:
            files[s["stem"] + ".so"] = _put(out, s["stem"] + ".so", b.so)
        doc = {"kernel": kdef.name, "target": s["target"], "arch": f"sm_{kdef.arch}", "formats": list(kdef.formats),
               "config": cfg, "source": Path(s["stem"]).name + ".cu",
               "source_sha256": files[s["stem"] + ".cu"], "compiled": b is not None, "why_not": why_not,
               "library": Path(s["stem"]).name + ".so" if b is not None else None,
               "entry": entry_names(kdef, cfg),
               "abi": {"run": ABI, "returns": RETURNS, "flags": _flags(kdef)},
               "operands": _operands(kdef), "problems": s["problems"], "cutlass": toolchain.cutlass,
               "nvcc": {"version": toolchain.version, "flags": nvcc_flags(kdef.arch)} if b is not None else None,
               "sass": b.sass if b is not None else None}
        files[s["stem"] + ".json"] = _put(out, s["stem"] + ".json", dumps(doc))
    return files


def _flags(kdef) -> dict:
    if kdef.sf_vec:
        return {}
    return {"1": "sa is per token, fp32 [M] (else (1,))", "2": "sb is per output channel, fp32 [N] (else (1,))"}


def _operands(kdef) -> dict:
    """What each pointer of `run` points at (docs/kernels.md "CUTLASS")."""
    if not kdef.sf_vec:
        return {"a": "e4m3 [M, K] row-major", "b": "e4m3 [N, K] row-major (the weight)", "sa": "fp32 (1,) or [M]",
                "sb": "fp32 (1,) or [N]", "alpha": "unused (null)", "d": "bf16 [M, N] row-major"}
    sf = "e4m3" if kdef.sf_vec == 16 else "E8M0 (u8)"
    layout = f"{sf}, one per {kdef.sf_vec} along K, Blackwell 128x4 layout (to_blackwell_scale_layout)"
    return {"a": "packed E2M1 u8 [M, K/2] (low nibble first)", "b": "packed E2M1 u8 [N, K/2] (the weight)",
            "sa": f"{layout}, rows M padded to 128", "sb": f"{layout}, rows N padded to 128",
            "alpha": "fp32 (1,) on the device: 1 / (input_global_scale * weight_global_scale) for NVFP4, "
                     "1 for MXFP4 (null: 1)", "d": "bf16 [M, N] row-major"}


def _write_indexes(out: Path, scheme: str, targets, probs, entries: dict, notes: dict, version: str,
                   why_not: str | None) -> dict[str, str]:
    files = {}
    cfg_of = lambda p: entries[tc.entry_key(p, version)]["config"]  # noqa: E731
    for target in targets:
        rows = [{"kernel": p.kernel, "n": p.n, "k": p.k, "m_bucket": p.m,
                 "file": f"kernels/{target}/cutlass/{stem(KERNELS[p.kernel], cfg_of(p))}"}
                for p in probs if p.target == target]
        doc = {"schema_version": 1, "scheme": scheme, "target": target, "cutlass": version,
               "compiled": why_not is None, "why_not": why_not, "note": notes.get(target, ""),
               "kernels": sorted({k.name for k in KERNELS.values() if scheme in k.formats and target in k.targets}),
               "problems": rows}
        rel = f"kernels/{target}/cutlass/index.json"
        files[rel] = _put(out, rel, dumps(doc))
    return files


def _merge_table(out: Path, entries: dict) -> dict[str, str]:
    """kernels/tuning.json with the CUTLASS entries used merged in (the Triton entries kept)."""
    path = out / TABLE
    old = load_table(path) if path.is_file() else None
    return {TABLE: _put(out, TABLE, dumps(merge(old, entries)))}


def _put(out: Path, rel: str, data: bytes) -> str:
    return write_bytes(out / rel, data)
