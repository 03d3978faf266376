"""`report`: write the artifact's HTML report into it (`tfcompile quantize --report`).

Runs last (after `verify`, and after `eval` when that is scheduled, whose per-layer figures it
plots: the recipe sets eval.details). The page goes to OUT/tfcompile/report.html, beside
manifest.json and, like it, outside the manifest's checksums (it is derived from the manifest,
whose sha256 it shows). Without --report nothing changes in the artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfcompile.pipeline.passes import PassResult, register_pass


@dataclass(frozen=True)
class ReportConfig:
    pass


@register_pass("report", config=ReportConfig, requires=("manifest", "out_dir"))
def report(ctx, cfg: ReportConfig, reporter) -> PassResult:
    """Write OUT/tfcompile/report.html from the manifest (and the eval figures)."""
    from tfcompile.report import IN_ARTIFACT, write_report

    sha = write_report(Path(ctx.out_dir), Path(ctx.out_dir) / IN_ARTIFACT)
    return PassResult(ctx, {"path": IN_ARTIFACT, "sha256": sha})
