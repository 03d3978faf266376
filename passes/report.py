"""`report`: write the artifact's HTML report into it (`tfcompile quantize --report`).

Scheduled by `--report` (any `report` setting: `when`), last (passes/builtin.py STANDARD). The page is built from
the manifest as written, so it is written in the pass's `finish`, after the manifest pass's
(finish hooks run in schedule order, after the last pass): OUT/tfcompile/report.html, beside
manifest.json; the page quotes the manifest's integrity digest, and its own sha256 is then
recorded in the manifest's integrity entry (`embed_report`), which verify checks. With `--eval`
it plots the per-layer eval figures, so it asks the eval pass to keep them (`implies`
eval.details). Without --report nothing changes in the artifact. `--sign` signs the manifest
after every finish hook (tfcompile/api.py), so the signature covers the final manifest and,
through the sha256 it records, the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfcompile.pipeline.context import Context
from tfcompile.pipeline.passes import PassResult, Selection, given, register_pass
from tfcompile.artifact.tree import REPORT_HTML


@dataclass(frozen=True)
class ReportConfig:
    pass


def _implies(sel: Selection) -> dict:
    """With --eval, the report plots per-layer figures: the eval pass stores them (eval.details)."""
    return {"eval": {"details": True}} if sel.given("report") and sel.given("eval") else {}


def _write(ctx: Context) -> Context:
    """After the manifest is written: OUT/tfcompile/report.html from it (its sha256 in the pass's stats)."""
    from tfcompile.report import embed_report  # lazy: the page builder (docs/design.md "Pass modules")
    sha = embed_report(Path(ctx.out_dir))
    stats = dict(ctx.pass_stats)
    stats["report"] = {**stats.get("report", {}), "sha256": sha}
    return ctx.with_(pass_stats=stats)


@register_pass("report", config=ReportConfig, requires=("manifest", "out_dir"),
               when=given("report"), implies=_implies, finish=_write)
def report(ctx, cfg: ReportConfig, reporter) -> PassResult:
    """Write OUT/tfcompile/report.html from the manifest (and the eval figures), after it is written."""
    return PassResult(ctx, {"path": REPORT_HTML})  # tfcompile.report.IN_ARTIFACT
