"""Option groups shared by the commands, each building its part of one options object.

A command stacks the groups it takes; each group declares its click options and, when the
command runs, moves their values out of click's keyword arguments into the command's
`run: RunOptions` (tfcompile/recipe/options.py) or `art: ArtifactOptions`, so commands
receive two objects instead of twenty parameters:

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
from tfcompile.recipe.options import CalibOptions, EvalOptions, LayoutOptions, RunOptions
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


def _update_run(kwargs: dict[str, Any], **changes: Any) -> None:
    kwargs["run"] = dataclasses.replace(kwargs.get("run") or RunOptions(), **changes)


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


# `load` settings of the commands that read a checkpoint (quantize, distill)
load_options = option_group([
    click.option("--allow-unknown-architecture", "allow_unknown_architecture", is_flag=True, default=None,
                 help="Quantize an architecture transformers does not have, by tensor names alone: "
                 "nothing checks that the checkpoint is complete (docs/cli.md \"Safety\")."),
    click.option("--engine", "engines", multiple=True, type=click.Choice(ENGINES),
                 help="The serving engine the artifact is for (repeatable): refuse to write what it cannot load "
                 "(tfcompile/artifact/engines.py; docs/interop.md). Without it, vllm and sglang are checked and "
                 "only warn. Its GPU and TP size: --set verify.engine_target=sm_100a, verify.engine_tp=8."),
], lambda v, kw: _update_run(kw, allow_unknown_architecture=v["allow_unknown_architecture"],
                             engines=tuple(v["engines"])))


recipe_options = option_group([
    click.option("--format", "fmt", envvar="TFCOMPILE_FORMAT", help="Preset: nvfp4, nvfp4a16, mxfp4, mxfp4a16, "
                 "mxfp8, fp8, fp8-dynamic, fp8-block. [env: TFCOMPILE_FORMAT]"),
    click.option("--recipe", "recipe_file", envvar="TFCOMPILE_RECIPE", type=click.Path(path_type=Path),
                 help="Recipe file (TOML or JSON). [env: TFCOMPILE_RECIPE]"),
    click.option("--preset", metavar="NAME", help="Named recipe under everything else: `best` takes, per "
                 "format, the method with the lowest KL measured on SmolLM2 (docs/accuracy.md; e.g. GPTQ + 4/6 "
                 "on 128 x 512 tokens; adds calibration). --recipe, the options and --set override it."),
    click.option("--set", "sets", multiple=True, metavar="PASS.FIELD=VALUE",
                 help="Set a pass option, e.g. --set pack.max_shard_mb=2000."),
    click.option("--ignore", multiple=True, metavar="PATTERN",
                 help="Leave matching Linear modules unquantized (glob, or re:REGEX)."),
    click.option("--export", "exports", multiple=True, type=click.Choice(["modelopt", "onnx"], case_sensitive=False),
                 help="Also write the modelopt (TensorRT-LLM) view under OUT/modelopt, or an ONNX "
                 "model with quantize/dequantize nodes under OUT/onnx (docs/onnx.md)."),
    click.option("--calib", metavar="DATA", help="Calibration data: a .txt/.jsonl/.json/.csv/.parquet "
                 "file, a save_to_disk folder, a cached data set name, 'python-doc', 'stdlib-docstrings' (the "
                 "Python standard library's docstrings), 'self' (short sequences the model samples), 'random', "
                 "or 'auto' (default: python-doc when installed and the tokenizer encodes it, else "
                 "stdlib-docstrings, else self)."),
    click.option("--calib-strict", "calib_strict", is_flag=True, default=None, envvar="TFCOMPILE_CALIB_STRICT",
                 help="Fail instead of falling back when --calib auto cannot use python-doc (release "
                 "pipelines: the same command must not calibrate on other text on another runner). "
                 "[env: TFCOMPILE_CALIB_STRICT]"),
    click.option("--calib-samples", type=int, help="Calibration sequences (default 16)."),
    click.option("--calib-seq-len", type=int, help="Tokens per calibration sequence (default 128)."),
    click.option("--calib-seed", type=int, help="Seed for shuffling/sampling calibration data (default 0)."),
    click.option("--calib-all-experts", "calib_all_experts", is_flag=True, default=None,
                 help="MoE: every calibration token also goes through every expert for the statistics "
                 "(routing and outputs unchanged), so no expert is left uncalibrated (docs/models.md)."),
    click.option("--observer", type=click.Choice(["max", "percentile", "mse"], case_sensitive=False),
                 help="Static activation "
                 "amax: max (default), percentile (99.99th of |x|; --set calibrate.percentile=P), mse "
                 "(clipping that minimises the format's quantization error)."),
    click.option("--algorithm", type=click.Choice(list(ALGORITHM_HELP), case_sensitive=False),
                 help="Weight rounding: " + ", ".join(f"{k} ({v})" for k, v in ALGORITHM_HELP.items()) + "."),
    click.option("--kv-cache", type=click.Choice(list(KV_FORMATS), case_sensitive=False), help="Quantize the KV cache: "
                 "calibrate k_scale/v_scale for an FP8 E4M3 or an NVFP4 cache (adds the calibrate pass)."),
    click.option("--kv-per-head", is_flag=True, default=None, help="One KV scale per KV head."),
    click.option("--device", metavar="auto|cpu|cuda|cuda:N", help="Where calibration, GPTQ, "
                 "the AWQ search, distillation and eval compute (default auto: the GPU when torch sees one; under "
                 "torchrun each rank's own GPU). Sets every scheduled pass's device; packed bytes "
                 "are encoded on the CPU either way."),
    click.option("--skip", multiple=True, metavar="PASS", help="Drop a pass from the pipeline."),
    click.option("--until", metavar="PASS", help="Stop after this pass (nothing is written before pack)."),
], lambda v, kw: _update_run(
    kw, fmt=v["fmt"], recipe_file=v["recipe_file"], preset=v["preset"], sets=v["sets"], ignore=v["ignore"], exports=v["exports"],
    algorithm=v["algorithm"], skip=v["skip"], until=v["until"], device=v["device"],
    calib=CalibOptions(data=v["calib"], samples=v["calib_samples"], seq_len=v["calib_seq_len"],
                       seed=v["calib_seed"], observer=v["observer"], kv_cache=v["kv_cache"],
                       kv_per_head=v["kv_per_head"], all_experts=v["calib_all_experts"], strict=v["calib_strict"])))


def _eval_values(v: dict[str, Any], kw: dict[str, Any]) -> None:
    if not v["tasks"] and (v["max_task_drop"] is not None or v["task_limit"] is not None):
        raise click.UsageError("--max-task-drop and --limit need --task NAME|YAML")
    _update_run(kw, report=v["report"], evaluation=EvalOptions(
        enabled=v["eval_"], text=v["eval_text"], max_tokens=v["eval_tokens"], max_kl=v["max_kl"],
        max_ppl_increase=v["max_ppl_increase"], min_top1=v["min_top1"], tasks=tuple(v["tasks"]) or None,
        max_task_drop=v["max_task_drop"], task_limit=v["task_limit"], keep_rejected=v["keep_rejected"]))


eval_options = option_group([
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
    click.option("--task", "tasks", multiple=True, metavar="NAME|YAML", help=f"Gate (--eval): {TASK_HELP}"),
    click.option("--max-task-drop", type=float, metavar="POINTS", help=f"Gate (--eval): {DROP_HELP}"),
    click.option("--limit", "task_limit", type=click.IntRange(min=1), metavar="N", help=LIMIT_HELP),
    click.option("--keep-rejected/--no-keep-rejected", default=None, help="When a gate is missed, keep the "
                 "complete, verifiable artifact at OUT.rejected/ to debug (default) or delete it."),
], _eval_values)


# quantize only (plan writes no gate results): `junit` for the command
junit_option = option_group([
    click.option("--junit", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                 help=f"With --eval: {JUNIT_HELP}"),
], lambda v, kw: kw.update(junit=v["junit"]))


emit_options = option_group([
    click.option("--target", "targets", metavar="sm_90a,sm_100a", help="Also compile the GPU "
                 "kernels for these targets into OUT/kernels/ (tuned by the cost model, or by "
                 "--set emit.tuning=TABLE)."),
    click.option("--cutlass", "emit_cutlass", type=click.Choice(["auto", "always", "never"], case_sensitive=False),
                 help="Also generate CUTLASS GEMMs for the --target targets into OUT/kernels/<target>/"
                 "cutlass/ and compile them with nvcc: auto (when CUDA 12.8+ and the nvidia-cutlass "
                 "headers are found, else sources only), always (an error without them), never "
                 "(sources only)."),
], lambda v, kw: _update_run(kw, targets=v["targets"], cutlass=v["emit_cutlass"]))


layout_options = option_group([
    click.option("--layout", "layout_target", type=click.Choice(list(LAYOUT_ENGINES), case_sensitive=False),
                 help="Target engine: validate the KV cache against it, write OUT/tfcompile/kv_cache.json "
                 "and, when its weights differ (trtllm: fused qkv/gate_up), the view OUT/<engine>/."),
    click.option("--tp", "layout_tp", type=int, help="Tensor-parallel size the view's heads are grouped "
                 "for (KV heads replicated when it exceeds them)."),
    click.option("--kv-layout", "layout_kv_layout", type=click.Choice(list(KV_LAYOUTS), case_sensitive=False),
                 help="KV-cache page layout (default: the backend's own)."),
    click.option("--kv-block-size", "layout_block_size", type=int, help="Tokens per KV-cache page "
                 "(default: the backend's)."),
], lambda v, kw: _update_run(kw, layout=LayoutOptions(
    target=v["layout_target"], tp=v["layout_tp"], kv_layout=v["layout_kv_layout"],
    block_size=v["layout_block_size"])))


# `tfcompile distill` options: each sets the `distill.*` field of its name (passes/distill.py)
_DISTILL_FIELDS = {"train_": "train", "distill_data": "data"}

distill_options = option_group([
    click.option("--steps", type=int, help="Optimizer steps (default 200; layerwise: per layer)."),
    click.option("--lr", type=float, help="Peak learning rate (default: 1e-4 weights, 2e-3 scales, 1e-3 lora)."),
    click.option("--train", "train_", type=click.Choice(["weights", "scales", "lora"], case_sensitive=False),
                 help="What trains: "
                 "the weights (default), the quantization scales only, or LoRA adapters merged before packing."),
    click.option("--init", type=click.Path(path_type=Path), help="Start the student from this artifact's "
                 "weights (a tfcompile artifact of the same model and format, e.g. a GPTQ one; default: "
                 "the checkpoint's, round-to-nearest)."),
    click.option("--mode", type=click.Choice(["model", "layerwise"], case_sensitive=False),
                 help="model: logit distillation "
                 "(default); layerwise: each decoder layer against the teacher layer's output."),
    click.option("--data", "distill_data", metavar="DATA", help="Training text: python-doc (default: its "
                 "train split; held-out split for the figures), a file or data set, self or random."),
    click.option("--batch", type=int, help="Blocks per micro-batch (default 8)."),
    click.option("--grad-accum", type=int, help="Micro-batches per optimizer step (default 1)."),
    click.option("--temperature", type=float, help="Softmax temperature of the KL loss (default 1)."),
    click.option("--teacher", type=click.Choice(["online", "cache"], case_sensitive=False),
                 help="Teacher logits computed every "
                 "step (default) or cached on disk first (top-k, --set distill.topk=K)."),
    click.option("--seed", type=int, help="Seed for data order and LoRA init (default 0)."),
    click.option("--sharding", type=click.Choice(["auto", "ddp", "fsdp"], case_sensitive=False),
                 help="Under torchrun: ddp (every "
                 "rank holds the whole student), fsdp (FSDP2: the student's parameters, gradients and "
                 "optimizer state sharded over the ranks), auto (default: fsdp when the student does not "
                 "fit one device)."),
    click.option("--resume-dir", type=click.Path(path_type=Path), help="Checkpoints, metrics.jsonl and "
                 "the teacher cache; rerun the same command to resume after Ctrl-C or a kill."),
    click.option("--metrics", type=click.Path(path_type=Path), help="Metrics as JSON lines (default "
                 "RESUME_DIR/metrics.jsonl)."),
], lambda v, kw: _update_run(kw, distill={_DISTILL_FIELDS.get(k, k): str(x) if isinstance(x, Path) else x
                                          for k, x in v.items() if x is not None}))
