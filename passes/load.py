"""`load`: open the checkpoint (memory-mapped) and read its architecture facts."""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.checkpoint_check import check_checkpoint, checkpoint_tensors
from tfcompile.errors import CheckpointError
from tfcompile.io.dtypes import dominant_code
from tfcompile.io.sources import open_source
from tfcompile.ir import ModelInfo
from tfcompile.pipeline.intents import RunsTheModel
from tfcompile.pipeline.passes import PassResult, recipe_intents, register_pass


@dataclass(frozen=True)
class LoadConfig:
    # quantize an architecture transformers does not have, by tensor names alone (nothing checks that
    # the checkpoint is complete): --allow-unknown-architecture; see tfcompile/checkpoint_check.py
    allow_unknown_architecture: bool = False


@register_pass("load", config=LoadConfig, requires=("source_path",), produces=("source", "model"))
def load(ctx, cfg: LoadConfig, reporter) -> PassResult:
    """Open the checkpoint memory-mapped; no tensor is read yet. A published quantized checkpoint
    (DeepSeek FP8-block, GPT-OSS MXFP4, compressed-tensors) reads as the bf16 model it encodes,
    decoded tensor by tensor (tfcompile/io/sources/)."""
    ckpt = open_source(ctx.source_path)
    dominant = dominant_code(ckpt.info(name).dtype for name in ckpt.names())
    if dominant is None:
        raise CheckpointError(f"{ckpt.path}: the checkpoint holds no tensors",
                              hint="point tfcompile at a Hugging Face model directory")
    note = check_checkpoint(ckpt.config, checkpoint_tensors(ckpt), where=str(ckpt.path),
                            allow_unknown=cfg.allow_unknown_architecture)  # before any pass reads a weight
    if note:
        _check_nothing_runs_the_model(ctx, ckpt)
        reporter.warn(f"load: {note}")
    model = ModelInfo.from_config(ckpt.config, dominant)
    stats = {"tensors": len(ckpt.names()), "files": len(ckpt.files), "bytes": ckpt.total_bytes,
             "architecture": model.architecture, "dtype": dominant,
             "source_format": getattr(ckpt, "source_format", {}).get("format", "safetensors")}
    return PassResult(ctx.with_(source=ckpt, model=model), stats)


def _check_nothing_runs_the_model(ctx, ckpt) -> None:
    """An unknown architecture (--allow-unknown-architecture) is quantized by tensor names alone; a
    pass that runs the model would fail deep in transformers (custom code it must not execute)."""
    needs = [f.by for f in recipe_intents(ctx.recipe, RunsTheModel)]  # passes that run the forward
    if not needs:
        return
    custom = " (its auto_map names custom code, which tfcompile never runs)" if ckpt.config.get("auto_map") else ""
    raise CheckpointError(f"{ckpt.path}/config.json: architecture {ckpt.config['architectures'][0]!r} is not in "
                          f"transformers{custom}, but {', '.join(needs)} must run the model",
                          hint="an unknown architecture quantizes by tensor names only: a weight-only format "
                               "with --algorithm rtn (e.g. --format nvfp4a16), without --eval, --kv-cache or distill")
