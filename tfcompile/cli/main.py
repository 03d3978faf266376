"""`tfcompile` command line. Exit codes: 0 ok, 1 user error or failed check, 2 usage/internal."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import click

from tfcompile import __version__
from tfcompile.cli.output import RichReporter, emit_json, stderr_console
from tfcompile.errors import TfcompileError

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "TFCOMPILE"}


def recipe_options(f):
    """Options shared by `quantize` and `plan`: they all edit one Recipe."""
    opts = [
        click.option("--format", "fmt", help="Preset: nvfp4, nvfp4a16, mxfp4, mxfp4a16, mxfp8, fp8, "
                     "fp8-dynamic, fp8-block. [env: TFCOMPILE_FORMAT]"),
        click.option("--recipe", "recipe_file", type=click.Path(path_type=Path),
                     help="Recipe file (TOML or JSON). [env: TFCOMPILE_RECIPE]"),
        click.option("--set", "sets", multiple=True, metavar="PASS.FIELD=VALUE",
                     help="Set a pass option, e.g. --set pack.max_shard_mb=2000."),
        click.option("--ignore", multiple=True, metavar="PATTERN",
                     help="Leave matching Linear modules unquantized (glob, or re:REGEX)."),
        click.option("--export", "exports", multiple=True, type=click.Choice(["modelopt"]),
                     help="Also write the modelopt (TensorRT-LLM) view under OUT/modelopt."),
        click.option("--calib", metavar="DATA", help="Calibration data: a .txt/.jsonl/.json/.csv/.parquet "
                     "file, a save_to_disk folder, a cached data set name, 'self' (default: sequences the "
                     "model samples) or 'random'."),
        click.option("--calib-samples", type=int, help="Calibration sequences (default 16)."),
        click.option("--calib-seq-len", type=int, help="Tokens per calibration sequence (default 128)."),
        click.option("--calib-seed", type=int, help="Seed for shuffling/sampling calibration data (default 0)."),
        click.option("--algorithm", type=click.Choice(["rtn", "mse", "gptq"]), help="Weight rounding: "
                     "rtn (default), mse (block-scale search), gptq (Hessian-aware; adds calibration)."),
        click.option("--kv-cache", type=click.Choice(["fp8"]), help="Quantize the KV cache: calibrate "
                     "k_scale/v_scale for an FP8 E4M3 cache (adds the calibrate pass)."),
        click.option("--kv-per-head", is_flag=True, default=None, help="One KV scale per KV head."),
        click.option("--skip", multiple=True, metavar="PASS", help="Drop a pass from the pipeline."),
        click.option("--until", metavar="PASS", help="Stop after this pass (nothing is written before pack)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _build(fmt, recipe_file, sets, ignore, exports, skip, until, calib=None, algorithm=None):
    from tfcompile.recipe.build import build_recipe

    overrides = {}
    if algorithm:
        overrides["quantize"] = {"algorithm": algorithm}
    calib_opts = {k: v for k, v in (calib or {}).items() if v is not None}
    if calib_opts:
        overrides["calibrate"] = calib_opts
    if ignore:
        overrides["select"] = {"ignore": list(ignore)}
    if exports:
        overrides["pack"] = {"export": list(exports)}
    if fmt is None and recipe_file is None:
        fmt = "nvfp4"
    return build_recipe(fmt=fmt, recipe_file=recipe_file, sets=sets, skip=skip, until=until,
                        overrides=overrides)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tfcompile")
def cli() -> None:
    """Compress and compile LLM checkpoints into packed low-precision artifacts."""


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Artifact directory to create (atomic).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@recipe_options
def quantize(model, out, overwrite, as_json, quiet, fmt, recipe_file, sets, ignore, exports, calib,
             calib_samples, calib_seq_len, calib_seed, algorithm, kv_cache, kv_per_head, skip, until):
    """Quantize the Hugging Face checkpoint MODEL into an artifact at OUT."""
    from tfcompile.api import run_pipeline
    from tfcompile.cli.tables import summary_table

    console = stderr_console()
    recipe = _build(fmt, recipe_file, sets, ignore, exports, skip, until,
                    dict(data=calib, samples=calib_samples, seq_len=calib_seq_len, seed=calib_seed,
                         kv_cache=kv_cache, kv_per_head=kv_per_head), algorithm)
    reporter = RichReporter(console, quiet=quiet)
    ctx = run_pipeline(model, out, recipe, overwrite=overwrite, reporter=reporter)
    if ctx.manifest is not None and not quiet:
        console.print(summary_table(ctx.manifest))
        console.print(f"wrote [bold]{out}[/]")
    if as_json:
        emit_json({"ok": True, "output": str(out) if ctx.artifact else None,
                   "recipe": recipe.to_dict(), "passes": ctx.pass_stats,
                   "summary": ctx.manifest["summary"] if ctx.manifest else None,
                   "layers": ctx.manifest["layers"] if ctx.manifest else None,
                   "warnings": reporter.warnings})


@cli.command()
@click.argument("model", required=False, type=click.Path(path_type=Path))
@recipe_options
def plan(model, fmt, recipe_file, sets, ignore, exports, calib, calib_samples, calib_seq_len, calib_seed,
         algorithm, kv_cache, kv_per_head, skip, until):
    """Print the resolved recipe (JSON on stdout) without running it."""
    from tfcompile.pipeline.manager import validate

    recipe = _build(fmt, recipe_file, sets, ignore, exports, skip, until,
                    dict(data=calib, samples=calib_samples, seq_len=calib_seq_len, seed=calib_seed,
                         kv_cache=kv_cache, kv_per_head=kv_per_head), algorithm)
    specs = validate(recipe)
    doc = recipe.to_dict()
    for entry, spec in zip(doc["passes"], specs):
        entry["requires"], entry["produces"] = sorted(spec.requires), sorted(spec.produces)
    emit_json(doc)


@cli.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest on stdout.")
@click.option("--layers/--no-layers", default=True, help="Show the per-layer table.")
def inspect(artifact, as_json, layers):
    """Show an artifact's manifest: format, sizes, per-layer SQNR."""
    from tfcompile.artifact.verify import load_manifest
    from tfcompile.cli.tables import layers_table, summary_table

    doc = load_manifest(artifact)
    if as_json:
        emit_json(doc)
        return
    console = stderr_console()
    console.print(summary_table(doc))
    if layers:
        console.print(layers_table(doc))


@cli.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report on stdout.")
def verify(artifact, as_json):
    """Check checksums, layers, shapes, scales and shared global scales (exit 1 on failure)."""
    from tfcompile.artifact.verify import verify_artifact
    from tfcompile.cli.tables import verify_table

    report = verify_artifact(artifact)
    if as_json:
        emit_json({"ok": report.ok, "path": report.path, "checks": report.checks})
    else:
        stderr_console().print(verify_table(report))
    if not report.ok:
        raise SystemExit(1)


from tfcompile.cli.eval_cmd import eval_cmd  # noqa: E402
cli.add_command(eval_cmd)


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to exit codes and `error:` / `hint:` lines."""
    try:
        cli.main(args=argv, prog_name="tfcompile", standalone_mode=False)
        return 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show(file=sys.stderr)
        return 2
    except click.exceptions.Abort:
        sys.stderr.write("aborted\n")
        return 130
    except TfcompileError as e:
        _print_error(e.message, e.hint)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; no output was written\n")
        return 130
    except Exception as e:  # noqa: BLE001 - internal error: exit 2 with the trace
        traceback.print_exc(file=sys.stderr)
        _print_error(f"internal error: {type(e).__name__}: {e}",
                     "this is a tfcompile bug; please report it with the command you ran")
        return 2


def _print_error(message: str, hint: str | None) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.write(f"hint: {hint or 'run with --help for usage'}\n")


def entry() -> None:
    """Console-script wrapper (`tfcompile`)."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
