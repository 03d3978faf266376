"""The commands' flags: each declared once, with the pass field it sets.

A flag that sets a pass's config field names it (`setting("calibrate.samples", "--calib-samples",
...)`): the group it belongs to moves every given value into `RunOptions.settings`, the pass
tables the recipe merges over the presets (tfcompile/recipe/build.py), so an option exists as a
click declaration and the config field it targets, and nothing in between. tests/cli/
test_choices.py holds every target to a real config field, every default a help text states to
that field's default, and the choices to the registries. A command stacks the groups it takes:

    @click.command()
    @artifact_options
    @recipe_options
    def quantize(art: ArtifactOptions, run: RunOptions): ...
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from tfcompile.artifact.engines import ENGINES
from tfcompile.cli.model_ref import REVISION_HELP
from tfcompile.cli.task_gates import DROP_HELP, JUNIT_HELP, LIMIT_HELP, TASK_HELP
from tfcompile.io.hub import resolve_model
from tfcompile.layout.engines import ENGINES as LAYOUT_ENGINES, KV_LAYOUTS
from tfcompile.passes.quantize import ALGORITHM_HELP
from tfcompile.recipe.options import RunOptions
from tfcompile.schemes import KV_FORMATS


@dataclass(frozen=True)
class ArtifactOptions:
    """MODEL (--revision), -o OUT, --overwrite, --json, -q, --sign: what a command that writes an
    artifact takes. `model` is a local directory: a Hub id ORG/NAME is resolved into the Hugging
    Face cache when the options are read (tfcompile/io/hub.py), so nothing after the command line
    knows the difference."""
    model: Path
    out: Path
    overwrite: bool = False
    as_json: bool = False
    quiet: bool = False
    sign_key: Path | None = None  # --sign: an ed25519 private key (tfcompile/artifact/signing.py)


def _artifact(v: dict[str, Any]) -> ArtifactOptions:
    model = resolve_model(v.pop("model"), v.pop("revision"), quiet=v["quiet"]).path
    return ArtifactOptions(model=model, **v)


def option_group(options: list, build: Callable[[dict[str, Any], dict[str, Any]], None]):
    """A decorator adding `options` to a command; at call time `build(values, kwargs)` receives the
    group's values (popped from click's kwargs, keyed by parameter name) and stores what it builds
    into kwargs (e.g. kwargs["run"])."""
    names = [o(lambda: None).__click_params__[0].name for o in options]

    def decorate(f):
        @functools.wraps(f, updated=())
        def command(*args, **kwargs):
            build({n: kwargs.pop(n) for n in names}, kwargs)
            return f(*args, **kwargs)

        command.__click_params__ = list(getattr(f, "__click_params__", []))
        for o in reversed(options):
            command = o(command)
        return command

    return decorate


def setting(target: str, *decls: str, also: dict[str, Any] | None = None, alone: bool = True, **attrs: Any):
    """A click option that sets `target`: "pass.field" (the value given), or "pass" (a flag that
    schedules the pass with its defaults). `also`: fields set with it (--engine makes the engine
    check strict); alone=False: dropped unless another flag of its pass is given (--no-keep-rejected
    does not schedule eval by itself)."""
    option = click.option(*decls, **attrs)
    option.target, option.also, option.alone = target, also or {}, alone
    return option


def _value(v: Any) -> Any:
    """A click value as a recipe value: repeated flags as lists, paths as strings."""
    if isinstance(v, tuple):
        return [_value(x) for x in v]
    return str(v) if isinstance(v, Path) else v


def _settings(options: list, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pass tables that the given flags of `options` set (a flag not given is None or ())."""
    out: dict[str, dict[str, Any]] = {}
    given = [(o, values[o.dest]) for o in options if values[o.dest] is not None and values[o.dest] != ()]
    for o, v in given:
        name, _, field = o.target.partition(".")
        if not o.alone and not any(p.alone and p.target.partition(".")[0] == name for p, _ in given):
            continue
        table = out.setdefault(name, {})
        if field:
            table[field] = _value(v)
        table.update(o.also)
    return out


def settings_group(options: list, check: Callable[[dict[str, Any]], None] | None = None, schedules: str = ""):
    """A group of `setting` flags (and plain ones, whose values go to RunOptions' field of their
    dest): their tables are merged into `run.settings`; `check(values)` may raise a UsageError;
    `schedules`: a pass the group's command always runs (`tfcompile distill`: distill)."""
    for o in options:
        o.dest = o(lambda: None).__click_params__[0].name

    def build(values: dict[str, Any], kw: dict[str, Any]) -> None:
        if check:
            check(values)
        run = kw.get("run") or RunOptions()
        tables = {n: dict(t) for n, t in run.settings.items()}
        if schedules:
            tables.setdefault(schedules, {})
        for name, table in _settings([o for o in options if hasattr(o, "target")], values).items():
            tables.setdefault(name, {}).update(table)
        plain = {o.dest: values[o.dest] for o in options if not hasattr(o, "target")}
        kw["run"] = dataclasses.replace(run, settings=tables, **plain)

    group = option_group(options, build)
    group.options = options  # tests/cli/test_choices.py reads the targets
    return group


artifact_options = option_group([
    click.argument("model", type=click.Path(path_type=Path)),
    click.option("--revision", metavar="REV", help=REVISION_HELP),
    click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
                 help="Artifact directory to create (atomic)."),
    click.option("--overwrite", is_flag=True, help="Replace OUT if it exists."),
    click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout."),
    click.option("-q", "--quiet", is_flag=True, help="No progress on stderr."),
    click.option("--sign", "sign_key", type=click.Path(path_type=Path), metavar="KEY",
                 help="Sign the artifact's manifest with this ed25519 private key (PEM or OpenSSH; "
                 "passphrase from TFCOMPILE_KEY_PASSPHRASE). The key never enters the artifact."),
], lambda v, kw: kw.__setitem__("art", _artifact(v)))



# settings of `quantize` alone (distill's --resume-dir is its training checkpoints)
quantize_options = settings_group([
    setting("calibrate.resume_dir", "--resume-dir", type=click.Path(path_type=Path), help="Keep each decoder "
            "layer's solve here (learned rounding; GPTQ with --set calibrate.propagate=true); rerun the same "
            "command after a kill or Ctrl-C to resume at the first unsolved layer (the same artifact bytes)."),
])


# `load` settings of the commands that read a checkpoint (quantize, distill)
load_options = settings_group([
    setting("load.allow_unknown_architecture", "--allow-unknown-architecture", "allow_unknown_architecture",
            is_flag=True, default=None,
            help="Quantize an architecture transformers does not have, by tensor names alone: "
            "nothing checks that the checkpoint is complete (docs/cli.md \"Safety\")."),
    setting("verify.engines", "--engine", "engines", also={"engine_strict": True}, multiple=True,
            type=click.Choice(ENGINES),
            help="The serving engine the artifact is for (repeatable): refuse to write what it cannot load "
            "(tfcompile/artifact/engines.py; docs/interop.md). Without it, vllm and sglang are checked and "
            "only warn. Its GPU and TP size: --set verify.engine_target=sm_100a, verify.engine_tp=8."),
])


recipe_options = settings_group([
    click.option("--format", "fmt", envvar="TFCOMPILE_FORMAT", help="Preset: nvfp4, nvfp4a16, mxfp4, mxfp4a16, "
                 "mxfp8, fp8, fp8-dynamic, fp8-block. [env: TFCOMPILE_FORMAT]"),
    click.option("--recipe", "recipe_file", envvar="TFCOMPILE_RECIPE", type=click.Path(path_type=Path),
                 help="Recipe file (TOML or JSON). [env: TFCOMPILE_RECIPE]"),
    click.option("--preset", metavar="NAME", help="Named recipe under everything else: `best` takes, per "
                 "format, the method with the lowest KL measured on SmolLM2 (docs/accuracy.md; e.g. GPTQ + 4/6 "
                 "on 128 x 512 tokens; adds calibration; in `distill`: GPTQ's artifact as the start, then the measured schedule). "
                 "--recipe, the options and --set override it."),
    click.option("--set", "sets", multiple=True, metavar="PASS.FIELD=VALUE",
                 help="Set a pass option, e.g. --set pack.max_shard_mb=2000."),
    setting("select.ignore", "--ignore", multiple=True, metavar="PATTERN",
            help="Leave matching Linear modules unquantized (glob, or re:REGEX)."),
    setting("pack.export", "--export", "exports", multiple=True,
            type=click.Choice(["modelopt", "onnx"], case_sensitive=False),
            help="Also write the modelopt (TensorRT-LLM) view under OUT/modelopt, or an ONNX "
            "model with quantize/dequantize nodes under OUT/onnx (docs/onnx.md)."),
    setting("calibrate.data", "--calib", metavar="DATA", help="Calibration data: a .txt/.jsonl/.json/.csv/.parquet "
            "file, a save_to_disk folder, a cached data set name, 'python-doc', 'stdlib-docstrings' (the "
            "Python standard library's docstrings), 'self' (short sequences the model samples), 'random', "
            "or 'auto' (default: python-doc when installed and the tokenizer encodes it, else "
            "stdlib-docstrings, else self)."),
    setting("calibrate.strict", "--calib-strict", "calib_strict", is_flag=True, default=None,
            envvar="TFCOMPILE_CALIB_STRICT",
            help="Fail instead of falling back when --calib auto cannot use python-doc (release "
            "pipelines: the same command must not calibrate on other text on another runner). "
            "[env: TFCOMPILE_CALIB_STRICT]"),
    setting("calibrate.samples", "--calib-samples", type=int, help="Calibration sequences (default 16)."),
    setting("calibrate.seq_len", "--calib-seq-len", type=int, help="Tokens per calibration sequence (default 128)."),
    setting("calibrate.seed", "--calib-seed", type=int,
            help="Seed for shuffling/sampling calibration data (default 0)."),
    setting("calibrate.all_experts", "--calib-all-experts", "calib_all_experts", is_flag=True, default=None,
            help="MoE: every calibration token also goes through every expert for the statistics "
            "(routing and outputs unchanged), so no expert is left uncalibrated (docs/models.md)."),
    setting("calibrate.observer", "--observer", type=click.Choice(["max", "percentile", "mse"], case_sensitive=False),
            help="Static activation amax: max (default), percentile (99.99th of |x|; --set "
            "calibrate.percentile=P), mse (clipping that minimises the format's quantization error)."),
    setting("quantize.algorithm", "--algorithm", type=click.Choice(list(ALGORITHM_HELP), case_sensitive=False),
            help="Weight rounding: " + ", ".join(f"{k} ({v})" for k, v in ALGORITHM_HELP.items()) + "."),
    setting("calibrate.kv_cache", "--kv-cache", type=click.Choice(list(KV_FORMATS), case_sensitive=False),
            help="Quantize the KV cache: calibrate k_scale/v_scale for an FP8 E4M3 or an NVFP4 cache (adds the "
            "calibrate pass)."),
    setting("calibrate.kv_per_head", "--kv-per-head", is_flag=True, default=None, help="One KV scale per KV head."),
    click.option("--device", metavar="auto|cpu|cuda|cuda:N", help="Where calibration, GPTQ, "
                 "the AWQ search, distillation and eval compute (default auto: the GPU when torch sees one; under "
                 "torchrun each rank's own GPU). Sets every scheduled pass's device; packed bytes "
                 "are encoded on the CPU either way."),
    click.option("--skip", multiple=True, metavar="PASS", help="Drop a pass from the pipeline."),
    click.option("--until", metavar="PASS", help="Stop after this pass (nothing is written before pack)."),
])


def _check_eval(v: dict[str, Any]) -> None:
    if not v["tasks"] and (v["max_task_drop"] is not None or v["task_limit"] is not None):
        raise click.UsageError("--max-task-drop and --limit need --task NAME|YAML")


eval_options = settings_group([
    setting("eval", "--eval", "eval_", is_flag=True, default=None, help="After verify, evaluate the "
            "staged artifact against MODEL and store the figures in its manifest."),
    setting("eval.text", "--eval-text", metavar="python-doc|FILE", help="Evaluation text: python-doc (the "
            "held-out corpus split, default) or a UTF-8 file (`eval --text`)."),
    setting("eval.max_tokens", "--eval-max-tokens", "--eval-tokens", "eval_tokens", type=int,
            help="Tokens of text to evaluate (default 16384; `eval --max-tokens`)."),
    setting("eval.max_kl", "--max-kl", type=float, help="Gate (--eval): mean KL(ref || model) in nats <= this."),
    setting("eval.max_ppl_increase", "--max-ppl-increase", type=float,
            help="Gate (--eval): relative perplexity increase <= this."),
    setting("eval.min_top1", "--min-top1", type=float, help="Gate (--eval): top-1 agreement >= this."),
    setting("report", "--report", "report", is_flag=True, default=None, help="Also write the HTML report "
            "(tfcompile report) into OUT/tfcompile/report.html; with --eval it plots the per-layer "
            "eval figures too."),
    setting("eval.tasks", "--task", "tasks", multiple=True, metavar="NAME|YAML", help=f"Gate (--eval): {TASK_HELP}"),
    setting("eval.max_task_drop", "--max-task-drop", type=float, metavar="POINTS", help=f"Gate (--eval): {DROP_HELP}"),
    setting("eval.task_limit", "--limit", "task_limit", type=click.IntRange(min=1), metavar="N", help=LIMIT_HELP),
    setting("eval.keep_rejected", "--keep-rejected/--no-keep-rejected", alone=False, default=None,
            help="When a gate is missed, keep the complete, verifiable artifact at OUT.rejected/ to debug "
            "(default) or delete it."),
], _check_eval)


# quantize only (plan writes no gate results): `junit` for the command
junit_option = option_group([
    click.option("--junit", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                 help=f"With --eval: {JUNIT_HELP}"),
], lambda v, kw: kw.update(junit=v["junit"]))


emit_options = settings_group([
    setting("emit.targets", "--target", "targets", metavar="sm_90a,sm_100a", help="Also compile the GPU "
            "kernels for these targets into OUT/kernels/ (tuned by the cost model, or by "
            "--set emit.tuning=TABLE)."),
    setting("emit_cutlass.compile", "--cutlass", "emit_cutlass",
            type=click.Choice(["auto", "always", "never"], case_sensitive=False),
            help="Also generate CUTLASS GEMMs for the --target targets into OUT/kernels/<target>/"
            "cutlass/ and compile them with nvcc: auto (when CUDA 12.8+ and the nvidia-cutlass "
            "headers are found, else sources only), always (an error without them), never "
            "(sources only)."),
])


layout_options = settings_group([
    setting("layout.target", "--layout", "layout_target", type=click.Choice(list(LAYOUT_ENGINES), case_sensitive=False),
            help="Target engine: validate the KV cache against it, write OUT/tfcompile/kv_cache.json "
            "and, when its weights differ (trtllm: fused qkv/gate_up), the view OUT/<engine>/."),
    setting("layout.tp", "--tp", "layout_tp", type=int, help="Tensor-parallel size the view's heads are "
            "grouped for (KV heads replicated when it exceeds them)."),
    setting("layout.kv_layout", "--kv-layout", "layout_kv_layout", type=click.Choice(list(KV_LAYOUTS),
            case_sensitive=False), help="KV-cache page layout (default: the backend's own)."),
    setting("layout.block_size", "--kv-block-size", "layout_block_size", type=int,
            help="Tokens per KV-cache page (default: the backend's)."),
])


# `tfcompile distill`: each flag sets the distill.* field it names (tfcompile/distill/config.py)
distill_options = settings_group([
    setting("distill.steps", "--steps", type=int, help="Optimizer steps (default 200; layerwise: per layer)."),
    setting("distill.lr", "--lr", type=float,
            help="Peak learning rate (default: 1e-4 weights, 2e-3 scales, 1e-3 lora)."),
    setting("distill.train", "--train", "train_", type=click.Choice(["weights", "scales", "lora"],
            case_sensitive=False), help="What trains: the weights (default), the quantization scales only, "
            "or LoRA adapters merged before packing."),
    setting("distill.init", "--init", type=click.Path(path_type=Path), help="Start the student from this "
            "artifact's weights (a tfcompile artifact of the same model and format, e.g. a GPTQ one), or `gptq`: "
            "build that GPTQ artifact first, with this run's settings (default: the checkpoint's weights, "
            "round-to-nearest)."),
    setting("distill.mode", "--mode", type=click.Choice(["model", "layerwise"], case_sensitive=False),
            help="model: logit distillation (default); layerwise: each decoder layer against the teacher "
            "layer's output."),
    setting("distill.data", "--data", "distill_data", metavar="DATA", help="Training text: python-doc (default: "
            "its train split; held-out split for the figures), a file or data set, self or random."),
    setting("distill.batch", "--batch", type=int, help="Blocks per micro-batch (default 8)."),
    setting("distill.grad_accum", "--grad-accum", type=int, help="Micro-batches per optimizer step (default 1)."),
    setting("distill.temperature", "--temperature", type=float,
            help="Softmax temperature of the KL loss (default 1)."),
    setting("distill.teacher", "--teacher", type=click.Choice(["online", "cache"], case_sensitive=False),
            help="Teacher logits computed every step (default) or cached on disk first (top-k, --set "
            "distill.topk=K)."),
    setting("distill.seed", "--seed", type=int, help="Seed for data order and LoRA init (default 0)."),
    setting("distill.sharding", "--sharding", type=click.Choice(["auto", "ddp", "fsdp"], case_sensitive=False),
            help="Under torchrun: ddp (every rank holds the whole student), fsdp (FSDP2: the student's "
            "parameters, gradients and optimizer state sharded over the ranks), auto (default: fsdp when the "
            "student does not fit one device)."),
    setting("distill.resume_dir", "--resume-dir", type=click.Path(path_type=Path), help="Checkpoints, "
            "metrics.jsonl and the teacher cache; rerun the same command to resume after Ctrl-C or a kill."),
    setting("distill.metrics", "--metrics", type=click.Path(path_type=Path), help="Metrics as JSON lines "
            "(default RESUME_DIR/metrics.jsonl)."),
], schedules="distill")
