"""`tfcompile` command line. Exit codes: 0 ok, 1 user error or failed check, 2 usage/internal."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import click

from tfcompile import __version__
from tfcompile.cli.model_ref import model_argument
from tfcompile.cli.output import RichReporter, emit_json, stderr_console
from tfcompile.cli.sign_cmd import load_overrides, public_key_option, sign_option, unknown_architecture_option
from tfcompile.errors import TfcompileError
from tfcompile.io.signals import Terminated, handle_signals

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "TFCOMPILE"}


def artifact_options(f):
    """MODEL (a directory or a Hub id, --revision), -o OUT, --overwrite, --json, -q: what `quantize`
    and `distill` share."""
    opts = [
        model_argument,
        click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
                     help="Artifact directory to create (atomic)."),
        click.option("--overwrite", is_flag=True, help="Replace OUT if it exists."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout."),
        click.option("-q", "--quiet", is_flag=True, help="No progress on stderr."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _to_meta(ctx: click.Context, param: click.Parameter, value):
    """Options that only set a pass field travel in the click context (no command signature change)."""
    if value is not None:
        ctx.meta[f"tfcompile.{param.name}"] = value
    return value


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
        click.option("--export", "exports", multiple=True, type=click.Choice(["modelopt", "onnx"]),
                     help="Also write the modelopt (TensorRT-LLM) view under OUT/modelopt, or an ONNX "
                     "model with quantize/dequantize nodes under OUT/onnx (docs/onnx.md)."),
        click.option("--calib", metavar="DATA", help="Calibration data: a .txt/.jsonl/.json/.csv/.parquet "
                     "file, a save_to_disk folder, a cached data set name, 'python-doc', 'self' (short sequences "
                     "the model samples), 'random', or 'auto' (default: python-doc when installed and the "
                     "tokenizer encodes it, else self)."),
        click.option("--calib-samples", type=int, help="Calibration sequences (default 16)."),
        click.option("--calib-seq-len", type=int, help="Tokens per calibration sequence (default 128)."),
        click.option("--calib-seed", type=int, help="Seed for shuffling/sampling calibration data (default 0)."),
        click.option("--calib-all-experts", is_flag=True, default=None, expose_value=False, callback=_to_meta,
                     help="MoE: every calibration token also goes through every expert for the statistics "
                     "(routing and outputs unchanged), so no expert is left uncalibrated (docs/models.md)."),
        click.option("--observer", type=click.Choice(["max", "percentile", "mse"]), help="Static activation "
                     "amax: max (default), percentile (99.99th of |x|; --set calibrate.percentile=P), mse "
                     "(clipping that minimises the format's quantization error)."),
        click.option("--algorithm", type=click.Choice(["rtn", "mse", "gptq", "awq", "smoothquant"]),
                     help="Weight rounding: rtn (default), mse (block-scale search), gptq (Hessian-aware; adds "
                     "calibration), awq (activation-aware scales folded into the norms; adds calibration), "
                     "smoothquant (activation outliers migrated into the weights through the norms; adds "
                     "calibration)."),
        click.option("--kv-cache", type=click.Choice(["fp8", "nvfp4"]), help="Quantize the KV cache: "
                     "calibrate k_scale/v_scale for an FP8 E4M3 or an NVFP4 cache (adds the calibrate pass)."),
        click.option("--kv-per-head", is_flag=True, default=None, help="One KV scale per KV head."),
        click.option("--skip", multiple=True, metavar="PASS", help="Drop a pass from the pipeline."),
        click.option("--until", metavar="PASS", help="Stop after this pass (nothing is written before pack)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def eval_options(f):
    """`--eval` and its options (quantize, plan): they configure the `eval` pass (passes/evaluate.py).
    Any of them schedules the pass; the command receives them as `**eval_opts`."""
    opts = [
        click.option("--eval", "eval_", is_flag=True, default=None, help="After verify, evaluate the "
                     "staged artifact against MODEL and store the figures in its manifest."),
        click.option("--eval-text", metavar="python-doc|FILE", help="Evaluation text: python-doc (the "
                     "held-out corpus split, default) or a UTF-8 file (`eval --text`)."),
        click.option("--eval-max-tokens", "--eval-tokens", "eval_tokens", type=int,
                     help="Tokens of text to evaluate (default 16384; `eval --max-tokens`)."),
        click.option("--max-kl", type=float, help="Gate (--eval): mean KL(ref || model) in nats <= this."),
        click.option("--max-ppl-increase", type=float, help="Gate (--eval): relative perplexity increase <= this."),
        click.option("--min-top1", type=float, help="Gate (--eval): top-1 agreement >= this."),
        click.option("--report", "report", is_flag=True, default=None, help="Also write the HTML report "
                     "(tfcompile report) into OUT/tfcompile/report.html; with --eval it plots the per-layer "
                     "eval figures too."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _eval_overrides(opts: dict | None) -> dict | None:
    """--eval options -> the eval pass's settings; None when none was given."""
    opts = opts or {}
    table = {"text": opts.get("eval_text"), "max_tokens": opts.get("eval_tokens"), "max_kl": opts.get("max_kl"),
             "max_ppl_increase": opts.get("max_ppl_increase"), "min_top1": opts.get("min_top1")}
    table = {k: v for k, v in table.items() if v is not None}
    return table if opts.get("eval_") or table else None


def emit_options(f):
    """`--target` (quantize, plan): schedules the `emit` pass (passes/emit.py); `--cutlass` adds
    the `emit_cutlass` pass (passes/emit_cutlass.py) for the same targets. The command receives
    `--cutlass` in `**eval_opts`; `_build` pops it."""
    f = click.option("--cutlass", "emit_cutlass", type=click.Choice(["auto", "always", "never"]),
                     help="Also generate CUTLASS GEMMs for the --target targets into OUT/kernels/<target>/"
                     "cutlass/ and compile them with nvcc: auto (when CUDA 12.8+ and the nvidia-cutlass "
                     "headers are found, else sources only), always (an error without them), never "
                     "(sources only).")(f)
    return click.option("--target", "targets", metavar="sm_90a,sm_100a", help="Also compile the GPU "
                        "kernels for these targets into OUT/kernels/ (tuned by the cost model, or by "
                        "--set emit.tuning=TABLE).")(f)


def layout_options(f):
    """`--layout`, `--tp`, `--kv-layout`, `--kv-block-size` (quantize, plan): schedule the `layout`
    pass (passes/layout.py). The command receives them in `**eval_opts`; `_layout_overrides` pops them."""
    opts = [
        click.option("--layout", "layout_target", type=click.Choice(["vllm", "sglang", "trtllm"]),
                     help="Target engine: validate the KV cache against it, write OUT/tfcompile/kv_cache.json "
                     "and, when its weights differ (trtllm: fused qkv/gate_up), the view OUT/<engine>/."),
        click.option("--tp", "layout_tp", type=int, help="Tensor-parallel size the view's heads are grouped "
                     "for (KV heads replicated when it exceeds them)."),
        click.option("--kv-layout", "layout_kv_layout", type=click.Choice(["NHD", "HND"]),
                     help="KV-cache page layout (default: the backend's own)."),
        click.option("--kv-block-size", "layout_block_size", type=int, help="Tokens per KV-cache page "
                     "(default: the backend's)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _layout_overrides(opts: dict) -> dict | None:
    """Pop the layout options out of a command's extra kwargs -> the layout pass's settings (or None)."""
    table = {"target": opts.pop("layout_target", None), "tp": opts.pop("layout_tp", None),
             "kv_layout": opts.pop("layout_kv_layout", None), "block_size": opts.pop("layout_block_size", None)}
    table = {k: v for k, v in table.items() if v is not None}
    return table or None


def _build(fmt, recipe_file, sets, ignore, exports, skip, until, calib=None, algorithm=None, evaluation=None,
           targets=None, layout=None, distill=None, load=None):
    from tfcompile.recipe.build import build_recipe

    overrides = {"load": load} if load else {}
    if evaluation and evaluation.pop("report", None):
        overrides["report"] = {}  # schedules the report pass (passes/report.py)
    if evaluation and (cutlass := evaluation.pop("emit_cutlass", None)):
        overrides["emit_cutlass"] = {"compile": cutlass}  # --cutlass: schedules emit_cutlass
    if distill is not None:
        overrides["distill"] = distill  # schedules the distill pass (tfcompile distill)
    if layout:
        overrides["layout"] = layout
    if targets:
        overrides["emit"] = {"targets": targets}
    if (eval_table := _eval_overrides(evaluation)) is not None:
        overrides["eval"] = eval_table
    if algorithm:
        overrides["quantize"] = {"algorithm": algorithm}
    all_experts = click.get_current_context(silent=True)
    all_experts = all_experts.meta.get("tfcompile.calib_all_experts") if all_experts else None
    calib_opts = {k: v for k, v in dict(calib or {}, all_experts=all_experts).items() if v is not None}
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
@artifact_options
@sign_option
@unknown_architecture_option
@recipe_options
@eval_options
@emit_options
@layout_options
def quantize(model, out, overwrite, as_json, quiet, sign_key, allow_unknown_architecture, fmt, recipe_file, sets,
             ignore, exports, calib, calib_samples, calib_seq_len, calib_seed, observer, algorithm, kv_cache,
             kv_per_head, skip, until, targets, **eval_opts):
    """Quantize the Hugging Face checkpoint MODEL into an artifact at OUT."""
    from tfcompile.api import run_pipeline
    from tfcompile.cli.eval_cmd import quantize_eval_failed, quantize_eval_table
    from tfcompile.cli.tables import summary_table

    console = stderr_console()
    layout = _layout_overrides(eval_opts)
    recipe = _build(fmt, recipe_file, sets, ignore, exports, skip, until,
                    dict(data=calib, samples=calib_samples, seq_len=calib_seq_len, seed=calib_seed,
                         observer=observer, kv_cache=kv_cache, kv_per_head=kv_per_head), algorithm, eval_opts,
                    targets, layout, load=load_overrides(allow_unknown_architecture))
    reporter = RichReporter(console, quiet=quiet)
    try:
        ctx = run_pipeline(model, out, recipe, overwrite=overwrite, reporter=reporter, sign_key=sign_key)
    except TfcompileError as e:  # a missed --eval gate: its figures on stderr / in --json, then exit 1
        quantize_eval_failed(e, console=console, quiet=quiet, as_json=as_json, recipe=recipe,
                             warnings=reporter.warnings)
        raise
    evaluation = (ctx.manifest or {}).get("eval")
    if ctx.manifest is not None and not quiet:
        console.print(summary_table(ctx.manifest))
        if evaluation:
            console.print(quantize_eval_table(evaluation))
        console.print(f"wrote [bold]{out}[/]")
    if as_json:
        emit_json({"ok": True, "output": str(out) if ctx.artifact else None,
                   "recipe": recipe.to_dict(), "passes": ctx.pass_stats,
                   "summary": ctx.manifest["summary"] if ctx.manifest else None,
                   "layers": ctx.manifest["layers"] if ctx.manifest else None,
                   "eval": evaluation, "warnings": reporter.warnings})


def distill_options(f):
    """`tfcompile distill` options: each sets one `distill.*` field (passes/distill.py)."""
    opts = [
        click.option("--steps", type=int, help="Optimizer steps (default 200; layerwise: per layer)."),
        click.option("--lr", type=float, help="Peak learning rate (default: 1e-4 weights, 2e-3 scales, 1e-3 lora)."),
        click.option("--train", "train_", type=click.Choice(["weights", "scales", "lora"]), help="What trains: "
                     "the weights (default), the quantization scales only, or LoRA adapters merged before packing."),
        click.option("--mode", type=click.Choice(["model", "layerwise"]), help="model: logit distillation "
                     "(default); layerwise: each decoder layer against the teacher layer's output."),
        click.option("--data", "distill_data", metavar="DATA", help="Training text: python-doc (default: its "
                     "train split; held-out split for the figures), a file or data set, self or random."),
        click.option("--batch", type=int, help="Blocks per micro-batch (default 8)."),
        click.option("--grad-accum", type=int, help="Micro-batches per optimizer step (default 1)."),
        click.option("--temperature", type=float, help="Softmax temperature of the KL loss (default 1)."),
        click.option("--teacher", type=click.Choice(["online", "cache"]), help="Teacher logits computed every "
                     "step (default) or cached on disk first (top-k, --set distill.topk=K)."),
        click.option("--seed", type=int, help="Seed for data order and LoRA init (default 0)."),
        click.option("--resume-dir", type=click.Path(path_type=Path), help="Checkpoints, metrics.jsonl and "
                     "the teacher cache; rerun the same command to resume after Ctrl-C or a kill."),
        click.option("--metrics", type=click.Path(path_type=Path), help="Metrics as JSON lines (default "
                     "RESUME_DIR/metrics.jsonl)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@cli.command()
@artifact_options
@sign_option
@unknown_architecture_option
@recipe_options
@distill_options
def distill(model, out, overwrite, as_json, quiet, sign_key, allow_unknown_architecture, fmt, recipe_file, sets,
            ignore, exports, calib, calib_samples, calib_seq_len, calib_seed, observer, algorithm, kv_cache,
            kv_per_head, skip, until, **opts):
    """Quantize MODEL with quantization-aware distillation against the original; write OUT."""
    from tfcompile.api import run_pipeline
    from tfcompile.cli.output import live_progress_allowed
    from tfcompile.cli.tables import summary_table

    names = {"train_": "train", "distill_data": "data"}
    table = {names.get(k, k): str(v) if isinstance(v, Path) else v for k, v in opts.items() if v is not None}
    console = stderr_console()
    recipe = _build(fmt, recipe_file, sets, ignore, exports, skip, until,
                    dict(data=calib, samples=calib_samples, seq_len=calib_seq_len, seed=calib_seed,
                         observer=observer, kv_cache=kv_cache, kv_per_head=kv_per_head), algorithm,
                    distill=table, load=load_overrides(allow_unknown_architecture))
    reporter = RichReporter(console, quiet=quiet)
    if not quiet and not live_progress_allowed(console):  # plain progress lines (loss, ETA) off a TTY
        reporter.note = console.print
    try:
        ctx = run_pipeline(model, out, recipe, overwrite=overwrite, reporter=reporter, sign_key=sign_key)
    except KeyboardInterrupt:
        if opts.get("resume_dir"):
            sys.stderr.write(f"checkpoint kept in {opts['resume_dir']}; rerun the same command to resume\n")
        raise
    record = (ctx.manifest or {}).get("distill")
    if ctx.manifest is not None and not quiet:
        console.print(summary_table(ctx.manifest))
        held = (record or {}).get("heldout") or {}
        if held.get("before") and held.get("after"):
            b, a = held["before"], held["after"]
            console.print(f"held-out ({a['tokens']} tokens): KL {b['kl_mean']:.5f} -> {a['kl_mean']:.5f} nats/token, "
                          f"perplexity {b['perplexity']:.3f} -> {a['perplexity']:.3f} "
                          f"(reference {a['reference_perplexity']:.3f}), round-to-nearest -> distilled")
        console.print(f"wrote [bold]{out}[/]")
    if as_json:
        emit_json({"ok": True, "output": str(out) if ctx.artifact else None,
                   "recipe": recipe.to_dict(), "passes": ctx.pass_stats,
                   "summary": ctx.manifest["summary"] if ctx.manifest else None,
                   "distill": record, "warnings": reporter.warnings})


@cli.command()
@click.argument("model", required=False, type=click.Path(path_type=Path))
@recipe_options
@eval_options
@emit_options
@layout_options
def plan(model, fmt, recipe_file, sets, ignore, exports, calib, calib_samples, calib_seq_len, calib_seed,
         observer, algorithm, kv_cache, kv_per_head, skip, until, targets, **eval_opts):
    """Print the resolved recipe (JSON on stdout) without running it."""
    from tfcompile.pipeline.manager import validate

    layout = _layout_overrides(eval_opts)
    recipe = _build(fmt, recipe_file, sets, ignore, exports, skip, until,
                    dict(data=calib, samples=calib_samples, seq_len=calib_seq_len, seed=calib_seed,
                         observer=observer, kv_cache=kv_cache, kv_per_head=kv_per_head), algorithm, eval_opts,
                    targets, layout)
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
@public_key_option
def verify(artifact, as_json, public_key):
    """Check paths, files, checksums, signature, layers, shapes, scales and shared global scales (exit 1 on failure)."""
    from tfcompile.artifact.signing import load_public_key
    from tfcompile.artifact.verify import verify_artifact
    from tfcompile.cli.tables import verify_table

    report = verify_artifact(artifact, public_key=load_public_key(public_key) if public_key else None)
    if as_json:
        emit_json({"ok": report.ok, "path": report.path, "checks": report.checks})
    else:
        stderr_console().print(verify_table(report))
    if not report.ok:
        raise SystemExit(1)


@cli.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--target", "targets", default="sm_90a,sm_100a", show_default=True, metavar="TARGETS",
              help="Comma-separated targets to tune for.")
@click.option("--buckets", default="1,16,64,256,1024,4096", show_default=True, metavar="M,...",
              help="M buckets (tokens in flight), decode to prefill.")
@click.option("--kernel", "kernels", multiple=True, metavar="NAME", help="Only this registered kernel.")
@click.option("--measure/--no-measure", default=None, help="Measure the best ranked configs on this "
              "machine's GPU (default: when one of the targets' GPUs is present).")
@click.option("--json", "as_json", is_flag=True, help="Print the tuning entries as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No table on stderr.")
def tune(artifact, targets, buckets, kernels, measure, as_json, quiet):
    """Tune the artifact's kernels; write ARTIFACT/kernels/tuning.json."""
    from tfcompile.errors import RecipeError
    from tfcompile.tune.hardware import parse_targets
    from tfcompile.tune.registry import load_kernels
    from tfcompile.tune.report import json_doc, summary_tables
    from tfcompile.tune.run import tune_artifact

    try:
        bucket_list = [int(b) for b in buckets.split(",") if b.strip()]
    except ValueError:
        raise RecipeError(f"--buckets {buckets!r} is not a list of integers", hint="e.g. --buckets 1,16,256") from None
    console = stderr_console()
    reporter = RichReporter(console, quiet=quiet)
    result = tune_artifact(artifact, parse_targets(targets), buckets=bucket_list, only=kernels, measure=measure,
                           reporter=reporter)
    reporter.task("", None)  # stop the progress bar
    for w in result.warnings:
        reporter.warn(w)
    if not quiet:
        for table in summary_tables(result.entries, load_kernels()[0]):
            console.print(table)
        console.print(f"tuned {len(result.entries)} problems in {result.seconds:.2f}s; "
                      f"wrote [bold]{artifact}/kernels/tuning.json[/]")
    if as_json:
        emit_json(json_doc(result, artifact))


@cli.command("export-onnx")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="The .onnx file to write; external data goes beside it as OUT.data.")
@click.option("--opset", type=int, help="Default-domain opset: 23 (default; FLOAT4E2M1) or newer "
              "(24+: MX scales as FLOAT8E8M0).")
@click.option("--external-data", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Weights in OUT.data: above ~1.9 GiB (auto), always, or never.")
@click.option("--overwrite", is_flag=True, help="Replace OUT (and OUT.data) if they exist.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Nothing on stderr but errors.")
def export_onnx(artifact, out, opset, external_data, overwrite, as_json, quiet):
    """Export ARTIFACT (or a plain checkpoint) as ONNX with quantize/dequantize nodes.

    Prints `SHA256  FILE` per file written on stdout (sha256sum's format), or JSON with --json."""
    from tfcompile.onnx_export import DEFAULT_OPSET, OnnxExportConfig, export_to_path, view_from_path

    view = view_from_path(artifact)
    cfg = OnnxExportConfig(opset=DEFAULT_OPSET if opset is None else opset, external_data=external_data)
    res = export_to_path(view, out, cfg, overwrite=overwrite)
    paths = {name: res.path.parent / name for name in res.files}
    if not quiet:
        fmt = view.scheme.name if view.scheme else "none (float checkpoint)"
        stderr_console().print(f"wrote [bold]{res.path}[/] (format {fmt}, opset {res.opset}, "
                               f"{res.initializer_bytes / 2**20:.1f} MiB of initializers"
                               f"{', external data' if res.external_data else ''}; custom ops: "
                               f"{', '.join(res.custom_ops) or 'none'}) in {res.seconds:.2f}s")
    if as_json:
        emit_json({"ok": True, "output": str(res.path), "format": view.scheme.name if view.scheme else None,
                   **res.to_dict(), "files": {str(paths[n]): sha for n, sha in res.files.items()}})
    else:
        for name, sha in res.files.items():
            sys.stdout.write(f"{sha}  {paths[name]}\n")


from tfcompile.cli.eval_cmd import eval_cmd  # noqa: E402
from tfcompile.cli.report_cmd import report_cmd  # noqa: E402
from tfcompile.cli.sign_cmd import sign_cmd  # noqa: E402
cli.add_command(eval_cmd)
cli.add_command(report_cmd)
cli.add_command(sign_cmd)


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to exit codes and `error:` / `hint:` lines."""
    with handle_signals():  # SIGINT / SIGTERM: clean unwinding, exit 130 / 143 (tfcompile/io/signals.py)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        cli.main(args=argv, prog_name="tfcompile", standalone_mode=False)
        return 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show(file=sys.stderr)
        sys.stderr.write(f"hint: {_usage_hint(e)}\n")
        return 2
    except click.exceptions.Abort as e:  # click turns KeyboardInterrupt (and Terminated) into Abort
        if isinstance(e.__cause__, KeyboardInterrupt):
            return _interrupted(e.__cause__)
        sys.stderr.write("aborted\n")
        return 130
    except TfcompileError as e:
        _print_error(e.message, e.hint)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except Exception as e:  # noqa: BLE001 - internal error: exit 2 with the trace
        traceback.print_exc(file=sys.stderr)
        _print_error(f"internal error: {type(e).__name__}: {e}",
                     "this is a tfcompile bug; please report it with the command you ran")
        return 2


def _interrupted(e: KeyboardInterrupt) -> int:
    """Exit 128 + signal (130 for Ctrl-C, 143 for SIGTERM) with one line, never a traceback."""
    name = e.name if isinstance(e, Terminated) else "SIGINT"
    published = getattr(e, "published", None)
    what = f"{published} was written before it arrived" if published else "nothing was written"
    sys.stderr.write(f"interrupted by {name}; {what}, temporary files were removed\n")
    return e.exit_code if isinstance(e, Terminated) else 130


def _usage_hint(e: click.ClickException) -> str:
    """The `hint:` line after click's own usage error (which may already say "Did you mean")."""
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "tfcompile"
    return f"run `{path} --help` for the options and arguments"


def _print_error(message: str, hint: str | None) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.write(f"hint: {hint or 'run with --help for usage'}\n")


def entry() -> None:
    """Console-script wrapper (`tfcompile`)."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
