"""`emit`: compile the artifact's GPU kernels ahead of time and write them into it.

Scheduled by `--target sm_90a,sm_100a` (recipe `emit.targets`), after pack
and before manifest, so every file it writes is in the manifest's checksums.
For each target, each kernel serving the scheme there (tfcompile.tune.registry),
each distinct Linear shape [N, K] and each M bucket, it takes the config from
the tuning table (`emit.tuning`, else OUT/kernels/tuning.json, else the cost
model's choice), compiles it with Triton for
GPUTarget("cuda", 90 | 100, 32) and writes

  kernels/<target>/<kernel>_<N>x<K>_m<M>.cubin   the binary (activation-quant: <kernel>_k<K>_m<M>)
  kernels/<target>/<kernel>_<N>x<K>_m<M>.ptx     its PTX (emit.ptx)
  kernels/<target>/<kernel>_<N>x<K>_m<M>.json    how to launch it
  kernels/tuning.json                            the configs used and how each was chosen
  kernels/index.json                             which kernels serve the scheme on each target

A config that fails to compile is replaced by the next ranked one (recorded
as `fallback_from`). Same inputs -> byte-identical files (tune/compile.py).

This module declares the pass; the emitter itself (tfcompile/tune/emit.py) is imported when it
runs, so declaring every pass costs start-up nothing heavy (docs/design.md "Pass modules").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfcompile.pipeline.intents import SingleScheme
from tfcompile.pipeline.passes import PassResult, Selection, Unsupported, check, register_pass
from tfcompile.recipe import Recipe
from tfcompile.tune.hardware import parse_targets
from tfcompile.tune.shapes import DEFAULT_BUCKETS, check_buckets


@dataclass(frozen=True)
class EmitConfig:
    targets: tuple[str, ...] = ()  # --target: sm_90a, sm_100a
    buckets: tuple[int, ...] = DEFAULT_BUCKETS  # M buckets (tokens in flight), decode to prefill
    kernels: tuple[str, ...] = ()  # only these registered kernels (default: every one serving the scheme)
    tuning: str = ""  # a tuning table (kernels/tuning.json of a tuned artifact) to take configs from
    ptx: bool = True  # also write the PTX beside each cubin


def _supports(recipe: Recipe, cfg: EmitConfig) -> list[Unsupported]:
    reasons = []
    if not cfg.targets:
        reasons.append(Unsupported("no target: give --target sm_90a,sm_100a (or emit.targets)"))
    reasons += check(parse_targets, cfg.targets)  # names the unknown target
    reasons += check(check_buckets, cfg.buckets)
    if cfg.kernels:
        from tfcompile.tune.emit import check_kernels  # lazy: the emitter (docs/design.md "Pass modules")
        from tfcompile.tune.registry import load_kernels
        reasons += check(check_kernels, cfg.kernels, load_kernels()[0])
    if cfg.tuning and not Path(cfg.tuning).is_file():
        reasons.append(Unsupported(f"emit.tuning {cfg.tuning}: no such file",
                                   "point at the kernels/tuning.json of a tuned artifact"))
    return reasons


def _when(sel: Selection) -> bool:
    """--target (emit.targets) schedules kernel emission."""
    return bool(sel.value("emit", "targets"))


@register_pass("emit", config=EmitConfig, requires=("plan", "artifact", "out_dir"), produces=("artifact",),
               supports=_supports, when=_when, ranks="root", intents=lambda c: (SingleScheme("emit"),))
def emit(ctx, cfg: EmitConfig, reporter) -> PassResult:
    """Compile the GEMM and activation-quant kernels per target and shape into kernels/."""
    from tfcompile.tune.emit import emit_kernels  # lazy: Triton and the tuner load when it runs
    files, stats = emit_kernels(Path(ctx.out_dir), ctx.plan.scheme, [la["shape"] for la in ctx.artifact.layers],
                                cfg, reporter)
    return PassResult(ctx.with_(artifact=ctx.artifact.with_files(files)), stats)
