"""`verify`: run `tfcompile verify`'s checks on the staged artifact before it is published.

The manifest is written after the last pass, so the checks read the one this run will
write (`manifest_doc`: every file and section the passes so far returned).

It also asks the serving engines (tfcompile/artifact/engines.py, the rules `verify --engine`
applies) whether they can serve the artifact as written: `verify.engines` (default vLLM and
SGLang, the engines of the compressed-tensors view) warn; `quantize --engine E` names the engine
the artifact is for and makes what E refuses to load an error (exit 1): nothing is published.
These settings change no byte of the artifact, so the manifest's recipe does not record them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcompile.artifact.engines import (DEFAULT_ENGINES, ENGINES, TARGETS, EngineProblem, check_engines,
                                        engine_record)
from tfcompile.artifact.verify import VerifyReport, verify_artifact
from tfcompile.engines import ENGINES as SERVING_ENGINES
from tfcompile.errors import VerifyError
from tfcompile.facts import fact
from tfcompile.manifest_doc import manifest_doc
from tfcompile.pipeline.intents import EngineChecks
from tfcompile.pipeline.passes import PassResult, Unsupported, register_pass

_RUNTIME = {"runtime": True}  # not recorded in the manifest's recipe: no byte depends on it


@dataclass(frozen=True)
class VerifyConfig:
    strict: bool = True  # a failed check fails the run (exit 1) and nothing is published
    checksums: bool = False  # re-hash files (pack hashed them as it wrote them)
    config_shapes: bool = False  # build the architecture with transformers to check shapes
    block_scales: bool = False  # read back per-block scales (pack checked them before writing)
    engines: tuple[str, ...] = field(default=DEFAULT_ENGINES, metadata=_RUNTIME)  # engines asked
    engine_strict: bool = field(default=False, metadata=_RUNTIME)  # --engine: what they refuse fails the run
    engine_target: str | None = field(default=None, metadata=_RUNTIME)  # GPU they serve on: sm_90a | sm_100a
    engine_tp: int = field(default=1, metadata=_RUNTIME)  # tensor-parallel size they split the Linears by


def _supports(recipe, cfg: VerifyConfig) -> list[Unsupported]:
    out = [Unsupported(f"verify.engines: {e!r} is not an engine tfcompile checks", "choose from: " + ", ".join(ENGINES))
           for e in cfg.engines if e not in SERVING_ENGINES]
    if cfg.engine_target is not None and cfg.engine_target not in TARGETS:
        out.append(Unsupported(f"verify.engine_target {cfg.engine_target!r}", "choose from: " + ", ".join(TARGETS)))
    if cfg.engine_tp < 1:
        out.append(Unsupported(f"verify.engine_tp {cfg.engine_tp} is below 1", "give the tensor-parallel size, e.g. 8"))
    return out


VERIFY = fact("verify", VerifyReport, "every check verify ran on the staged artifact", owner=__name__)


@register_pass("verify", config=VerifyConfig, requires=("manifest", "out_dir"), produces=(VERIFY,),
               supports=_supports, ranks="root",
               intents=lambda c: (EngineChecks(tuple(c.engines), c.engine_target, c.engine_tp),))
def verify(ctx, cfg: VerifyConfig, reporter) -> PassResult:
    """Check checksums, layers, shapes, scales and shared global scales; ask the serving engines."""
    doc = manifest_doc(ctx)
    report = verify_artifact(ctx.out_dir, checksums=cfg.checksums, config_shapes=cfg.config_shapes,
                             block_scales=cfg.block_scales, manifest=doc)
    if cfg.strict and not report.ok:
        first = report.failures()[0]
        raise VerifyError(f"artifact failed check '{first['check']}': {first['detail']}",
                          hint="this is a tfcompile bug if the input was valid; please report it")
    for c in report.failures():
        reporter.warn(f"verify: {c['check']}: {c['detail']}")
    problems = check_engines(doc, cfg.engines, target=cfg.engine_target, tp=cfg.engine_tp)
    _engine_verdict(problems, cfg, reporter)
    return PassResult(ctx.add(VERIFY, report),
                      {"checks": len(report.checks), "failed": len(report.failures()),
                       "engines": {e: r["verdict"] for e, r in engine_record(problems, cfg.engines).items()}})


def _engine_verdict(problems: list[EngineProblem], cfg: VerifyConfig, reporter) -> None:
    """--engine: the first refusal is the run's error; otherwise each problem is one warning."""
    refused = [p for p in problems if p.error]
    if cfg.engine_strict and refused:
        p = refused[0]
        raise VerifyError(f"--engine {p.engine}: {p.message}",
                          hint=f"{p.hint}; or drop --engine {p.engine} to write it anyway (for another engine)")
    for p in problems:
        what = "cannot load this artifact" if p.error else "serves this artifact otherwise than written"
        tail = f" (quantize --engine {p.engine} refuses to write it)" if p.error else ""
        reporter.warn(f"engine {p.engine} {what}: {p.message}{tail}\nhint: {p.hint}")

