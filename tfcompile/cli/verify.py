"""`tfcompile verify ARTIFACT`: every check, exit 1 when one fails."""

from __future__ import annotations

from pathlib import Path

import click

from tfcompile.artifact.engines import ENGINES, TARGETS, engine_problems
from tfcompile.artifact.manifest import load_manifest
from tfcompile.artifact.signing import load_public_key
from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.cli.sign_cmd import public_key_option
from tfcompile.cli.tables import verify_table
from tfcompile.errors import VerifyError


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report on stdout.")
@click.option("--engine", "engines", multiple=True, type=click.Choice(ENGINES),
              help="Also check that this serving engine can serve the artifact as written (repeatable).")
@click.option("--target", type=click.Choice(TARGETS), default=None, help="GPU the engine serves it on.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel size the engine splits the Linears by.")
@public_key_option
def verify(artifact: Path, as_json: bool, engines: tuple[str, ...], target: str | None, tp: int,
           public_key: Path | None) -> None:
    """Check paths, files, checksums, signature, layers, shapes, scales and shared global scales (exit 1 on failure)."""
    key = load_public_key(public_key) if public_key else None
    doc = load_manifest(artifact)  # not an artifact: exit 1 before torch is imported
    from tfcompile.artifact.verify import verify_artifact  # lazy: verify.py imports torch

    report = verify_artifact(artifact, public_key=key, manifest=doc)
    if engines:
        add_engine_checks(report, doc, engines, target=target, tp=tp)
    if as_json:
        emit_json({"ok": report.ok, "path": report.path, "checks": report.checks})
    else:
        stderr_console().print(verify_table(report))
    if not report.ok:  # after the report: main prints `error:` and `hint:` lines, exit 1
        raise verify_error(report)


# what to do about a failed check, by check name (the first that matches; else the generic hint)
_HINTS = (
    ("signature", "check --public-key is the release key's public half, or sign the artifact again: "
                  "tfcompile sign ARTIFACT --key KEY"),
    ("engine", "see each engine's hint in the detail above, or rebuild for that engine (--layout, --format)"),
    ("manifest", "the manifest is missing, unreadable or edited: rebuild the artifact (tfcompile quantize ... "
                 "--overwrite) or fetch it again"),
)
_FILES_HINT = ("the artifact's files changed since it was built: rebuild it (tfcompile quantize ... --overwrite) "
               "or fetch it again")


def verify_error(report) -> VerifyError:
    """The error naming every failed check (first line of each detail) and what to do."""
    bad = report.failures()
    parts = "; ".join(f"'{c['check']}' ({(c['detail'] or 'failed').splitlines()[0]})" for c in bad)
    hint = next((h for key, h in _HINTS for c in bad if c["check"].startswith(key)), _FILES_HINT)
    return VerifyError(f"{report.path}: {len(bad)} of {len(report.checks)} verify checks failed: {parts}", hint=hint)


def add_engine_checks(report, doc, engines, *, target, tp) -> None:
    """One check per engine (tfcompile/artifact/engines.py): fails on what the engine refuses to load;
    what it loads but serves otherwise than written passes with a warning in the detail."""
    for engine in engines:
        problems = engine_problems(doc, engine, target=target, tp=tp)
        errors = [p for p in problems if p.error]
        detail = "; ".join(f"{'' if p.error else 'warning: '}{p.message}\nhint: {p.hint}" for p in problems)
        where = f" ({target}, tp {tp})" if target else f" (tp {tp})"
        report.add(f"engine {engine}{where}", not errors, detail or "serves it as written")
