"""`load`: open the checkpoint (memory-mapped) and read its architecture facts."""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.errors import CheckpointError
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.ir import ModelInfo
from tfcompile.pipeline.passes import PassResult, register_pass


@dataclass(frozen=True)
class LoadConfig:
    pass


@register_pass("load", config=LoadConfig, requires=("source_path",), produces=("source", "model"), slot=0)
def load(ctx, cfg: LoadConfig, reporter) -> PassResult:
    """Open the checkpoint memory-mapped; no tensor is read yet."""
    ckpt = open_checkpoint(ctx.source_path)
    dtypes: dict[str, int] = {}
    for name in ckpt.names():
        info = ckpt.info(name)
        dtypes[info.dtype] = dtypes.get(info.dtype, 0) + 1
    if not dtypes:
        raise CheckpointError(f"{ckpt.path}: the checkpoint holds no tensors",
                              hint="point tfcompile at a Hugging Face model directory")
    dominant = max(sorted(dtypes), key=lambda d: dtypes[d])
    model = ModelInfo.from_config(ckpt.config, dominant)
    stats = {"tensors": len(ckpt.names()), "files": len(ckpt.files), "bytes": ckpt.total_bytes,
             "architecture": model.architecture, "dtype": dominant}
    return PassResult(ctx.with_(source=ckpt, model=model), stats)
