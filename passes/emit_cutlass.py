"""`emit_cutlass`: generate the artifact's CUTLASS GEMMs as C++, compile them with nvcc.

Scheduled by `--cutlass auto` or any `emit_cutlass` setting (`--set emit_cutlass.compile=auto`, a recipe's
`[passes.emit_cutlass]`), with the targets and tuning table of `--target` (emit.targets,
emit.tuning) unless its own settings name others. Its place in the standard order
(passes/builtin.py) is after `manifest` and before `verify` (which checks every checksum it adds); it returns what it generated and whether
nvcc compiled it (the fact `CUTLASS`, the manifest's "cutlass" section) with its files, and the
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

This module declares the pass; the generator (tfcompile/tune/cutlass_emit.py) is imported when it
runs (docs/design.md "Pass modules").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfcompile.facts import fact
from tfcompile.kernels.cutlass.toolchain import detect
from tfcompile.pipeline.intents import SingleScheme
from tfcompile.pipeline.passes import PassResult, Selection, Unsupported, check, given, register_pass
from tfcompile.recipe import Recipe
from tfcompile.tune.hardware import parse_targets
from tfcompile.tune.shapes import DEFAULT_BUCKETS, check_buckets

COMPILE_MODES = ("auto", "always", "never")



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


def _implies(sel: Selection) -> dict:
    """The targets and tuning table of `--target` (emit.targets, emit.tuning), unless given."""
    if not sel.given("emit_cutlass"):
        return {}
    emit = sel.settings.get("emit", {})
    return {"emit_cutlass": {k: emit[k] for k in ("targets", "tuning") if emit.get(k)}}


# what was generated and whether nvcc compiled it (no other pass reads it: declared here)
CUTLASS = fact("cutlass", dict, "emit_cutlass: the CUTLASS sources generated and compiled",
               manifest=lambda ctx, section: {"cutlass": section}, owner=__name__)


@register_pass("emit_cutlass", config=EmitCutlassConfig, requires=("plan", "artifact", "out_dir"),
               produces=("artifact", CUTLASS), supports=_supports, when=given("emit_cutlass"),
               implies=_implies, ranks="root", intents=lambda c: (SingleScheme("emit_cutlass"),))
def emit_cutlass(ctx, cfg: EmitCutlassConfig, reporter) -> PassResult:
    """Generate and compile the CUTLASS GEMMs per target and tile config into kernels/<target>/cutlass/."""
    # lazy: the generator and nvcc driver (tfcompile/tune/cutlass_emit.py) load when the pass runs
    from tfcompile.tune.cutlass_emit import emit_cutlass_kernels
    shapes = sorted({tuple(int(v) for v in la["shape"]) for la in ctx.artifact.layers})
    files, section, stats = emit_cutlass_kernels(Path(ctx.out_dir), ctx.plan.scheme.name, shapes, cfg, reporter)
    return PassResult(ctx.with_(artifact=ctx.artifact.with_files(files)).add(CUTLASS, section), stats)
