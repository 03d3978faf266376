"""`verify`: run `tfcompile verify`'s checks on the staged artifact before it is published.

The manifest is written after the last pass, so the checks read the one this run will
write (`manifest_doc`: every file and section the passes so far returned)."""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.artifact.verify import verify_artifact
from tfcompile.errors import VerifyError
from tfcompile.passes.manifest import manifest_doc
from tfcompile.pipeline.passes import PassResult, register_pass


@dataclass(frozen=True)
class VerifyConfig:
    strict: bool = True  # a failed check fails the run (exit 1) and nothing is published
    checksums: bool = False  # re-hash files (pack hashed them as it wrote them)
    config_shapes: bool = False  # build the architecture with transformers to check shapes
    block_scales: bool = False  # read back per-block scales (pack checked them before writing)


@register_pass("verify", config=VerifyConfig, requires=("manifest", "out_dir"), produces=("verify",))
def verify(ctx, cfg: VerifyConfig, reporter) -> PassResult:
    """Check checksums, layers, shapes, scales and shared global scales."""
    report = verify_artifact(ctx.out_dir, checksums=cfg.checksums, config_shapes=cfg.config_shapes,
                             block_scales=cfg.block_scales, manifest=manifest_doc(ctx))
    if cfg.strict and not report.ok:
        first = report.failures()[0]
        raise VerifyError(f"artifact failed check '{first['check']}': {first['detail']}",
                          hint="this is a tfcompile bug if the input was valid; please report it")
    for c in report.failures():
        reporter.warn(f"verify: {c['check']}: {c['detail']}")
    return PassResult(ctx.with_(verify=report),
                      {"checks": len(report.checks), "failed": len(report.failures())})
