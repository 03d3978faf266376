"""`emit_cutlass`: generate the artifact's CUTLASS GEMMs as C++, compile them with nvcc.

Scheduled by `--cutlass auto` or any `emit_cutlass` setting (`--set emit_cutlass.compile=auto`, a recipe's
`[passes.emit_cutlass]`), with the targets and tuning table of `--target` (emit.targets,
emit.tuning) unless its own settings name others. Its place in the standard order
(passes/builtin.py) is after `manifest` and before `verify` (which checks every checksum it adds); it returns what it generated and whether
nvcc compiled it (`ctx.cutlass`, the manifest's "cutlass" section) with its files, and the
manifest, written after the last pass, records both.

For each target, each CUTLASS GEMM serving the format there (kernels/cutlass/configs.py:
sm_90a FP8 -> `cutlass_fp8_gemm_sm90`, sm_100a NVFP4 / MXFP4 -> the block-scaled GEMMs),
each distinct Linear shape [N, K] and each M bucket, a config is taken from the tuning
table (`emit_cutlass.tuning`, else the artifact's kernels/tuning.json) or ranked by the
cost model (tfcompile/tune/cutlass.py), then the configs are consolidated
(`emit_cutlass.slack`). N, K and M are runtime arguments of a CUTLASS kernel, so one
source is written per (target, kernel, config) chosen, not per shape:

  kernels/<target>/cutlass/<kernel>_<config id>.cu    generated source (header: do not edit, its config)
  kernels/<target>/cutlass/<kernel>_<config id>.so    nvcc -gencode arch=compute_<arch>,code=sm_<arch> (compiled only)
  kernels/<target>/cutlass/<kernel>_<config id>.json  entry points, ABI, config, nvcc, SASS evidence
  kernels/<target>/cutlass/index.json                 (kernel, N, K, M bucket) -> source
  kernels/tuning.json                                 the CUTLASS entries used, merged in

Compilation (`emit_cutlass.compile`): `auto` compiles when nvcc >= 12.8 and the CUTLASS
headers are found, else writes the sources only and says so (manifest "cutlass" section,
a warning); `always` fails without them; `never` writes sources only. Builds run in
parallel, bounded by memory, and are cached by content hash (kernels/cutlass/build.py).
Every build's SASS must contain the kernel's MMA, else emission fails (sass.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from tfcompile.errors import RecipeError
from tfcompile.io.jsonfile import JsonDict, dumps, write_bytes
from tfcompile.kernels.cutlass.build import Job, build_all
from tfcompile.kernels.cutlass.configs import KERNELS
from tfcompile.kernels.cutlass.render import entry_names, render, stem
from tfcompile.kernels.cutlass.toolchain import Toolchain, detect, nvcc_flags
from tfcompile.pipeline.passes import PassResult, Settings, Unsupported, check, given, register_pass
from tfcompile.pipeline.recipe import Recipe
from tfcompile.tune import cutlass as tc
from tfcompile.tune.hardware import parse_targets
from tfcompile.tune.shapes import DEFAULT_BUCKETS, check_buckets
from tfcompile.tune.table import TABLE, load_table, merge

COMPILE_MODES = ("auto", "always", "never")
ABI = ("int run(const void* a, const void* b, const void* sa, const void* sb, const float* alpha, void* d, "
       "int m, int n, int k, int flags, void* workspace, size_t workspace_bytes, void* stream)")
RETURNS = {"0": "ok", "1": "can_implement failed (shape / alignment)", "2": "workspace too small",
           "3": "initialize failed", "4": "launch failed (see *_last_cuda_error)", "5": "no CUDA device"}


@dataclass(frozen=True)
class EmitCutlassConfig:
    targets: tuple[str, ...] = ()  # default: --target (emit.targets)
    buckets: tuple[int, ...] = DEFAULT_BUCKETS  # M buckets configs are chosen for
    compile: str = "auto"  # auto | always | never
    tuning: str = ""  # a tuning table with CUTLASS entries (default: emit.tuning, else OUT/kernels/tuning.json)
    slack: float = 1.1  # drop a config when others are predicted within this factor for all its problems
    jobs: int = 0  # parallel nvcc jobs (0: CPU count); memory bounds them too (~4-5 GB each)


def _supports(recipe: Recipe, cfg: EmitCutlassConfig) -> list[Unsupported]:
    reasons = []
    if not cfg.targets:
        reasons.append(Unsupported("no target: give --target sm_90a,sm_100a (or emit_cutlass.targets)"))
    reasons += check(parse_targets, cfg.targets)
    reasons += check(check_buckets, cfg.buckets)
    if cfg.compile not in COMPILE_MODES:
        reasons.append(Unsupported(f"emit_cutlass.compile={cfg.compile!r}", "one of: " + ", ".join(COMPILE_MODES)))
    if cfg.slack < 1.0 or cfg.jobs < 0:
        reasons.append(Unsupported(f"emit_cutlass: slack {cfg.slack} / jobs {cfg.jobs} out of range",
                                   "slack >= 1.0 (1.0 keeps every chosen config), jobs >= 0"))
    if cfg.tuning and not Path(cfg.tuning).is_file():
        reasons.append(Unsupported(f"emit_cutlass.tuning {cfg.tuning}: no such file",
                                   "point at the kernels/tuning.json of a tuned artifact"))
    if cfg.compile == "always":
        reasons += check(detect().require)  # before any slow pass runs
    return reasons


def _implies(settings: Settings) -> dict:
    """The targets and tuning table of `--target` (emit.targets, emit.tuning), unless given."""
    if "emit_cutlass" not in settings:
        return {}
    emit = settings.get("emit", {})
    return {"emit_cutlass": {k: emit[k] for k in ("targets", "tuning") if emit.get(k)}}


@register_pass("emit_cutlass", config=EmitCutlassConfig, requires=("plan", "artifact", "out_dir"),
               produces=("artifact", "cutlass"), supports=_supports, when=given("emit_cutlass"),
               implies=_implies, ranks="root")
def emit_cutlass(ctx, cfg: EmitCutlassConfig, reporter) -> PassResult:
    """Generate and compile the CUTLASS GEMMs per target and tile config into kernels/<target>/cutlass/."""
    shapes = sorted({tuple(int(v) for v in la["shape"]) for la in ctx.artifact.layers})
    files, section, stats = emit_cutlass_kernels(Path(ctx.out_dir), ctx.plan.scheme.name, shapes, cfg, reporter)
    return PassResult(ctx.with_(artifact=ctx.artifact.with_files(files), cutlass=section), stats)


def emit_cutlass_kernels(out: Path, scheme: str, shapes: list[tuple[int, int]], cfg: EmitCutlassConfig,
                         reporter) -> tuple[dict[str, str], JsonDict, dict]:
    """Write sources (and, when compiling, libraries) for format `scheme` and the Linear shapes;
    returns (relative path -> sha256, manifest section, stats)."""
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


def _table(out: Path, cfg: EmitCutlassConfig) -> dict | None:
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
