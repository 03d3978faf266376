"""What a scheduled pass will do, as typed facts the other passes read instead of its config.

A pass that another pass must know about before it runs declares `intents(cfg)` when it
registers (tfcompile/pipeline/passes.py): the facts its settings promise, e.g. calibrate with
`--kv-cache fp8` promises `KVCacheScales("fp8", per_head=False)`. A reader asks the recipe for a
kind of fact (`recipe_intent(recipe, KVCacheScales)`), never for another pass's name or config,
so a second pass that calibrates KV scales, or runs the model, is found without editing its
readers (issue 25: passes never read one another's config).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class RunsTheModel:
    """The pass builds the transformers model and runs its forward (an unknown architecture,
    quantized by tensor names alone, cannot take it: passes/load.py)."""
    by: str  # the pass, for the error message


@dataclass(frozen=True)
class KVCacheScales:
    """KV-cache scales will be calibrated: `kind` a tfcompile.schemes.KV_FORMATS name."""
    kind: str
    per_head: bool


@dataclass(frozen=True)
class CalibrationRun:
    """The model will run on calibration data, layer by layer: `samples` sequences of `seq_len`
    tokens, `batch` per layer call (`plan --estimate` costs it). `propagate`: each layer is solved
    (or run again quantized) in the loop before the next; `hessian`: X^T X recorded per group, only
    its diagonal `hessian_blocks` x `hessian_blocks` blocks when that is above 0."""
    samples: int
    seq_len: int
    batch: int
    propagate: bool
    hessian: bool
    hessian_blocks: int = 0


@dataclass(frozen=True)
class ShardSize:
    """The artifact is written in safetensors shards of at most `max_mb` MiB."""
    max_mb: float


@dataclass(frozen=True)
class EngineChecks:
    """The serving engines `engines` will be asked whether they serve the artifact as written, on
    GPU `target` (None: each engine's default) at tensor-parallel size `tp`."""
    engines: tuple[str, ...]
    target: str | None
    tp: int


@dataclass(frozen=True)
class SharedGlobalScales:
    """Fusion groups (q/k/v, gate/up) share one NVFP4 global scale, so an engine may fuse them."""
    shared: bool


@dataclass(frozen=True)
class WeightRounding:
    """How weights round to their format: `algorithm` a tfcompile.ir ALGORITHMS name, `mx_rule`
    the MX scale rule ("" the format's default)."""
    algorithm: str
    mx_rule: str


@dataclass(frozen=True)
class LayerSolve:
    """Weights will be solved by `algorithm` (its layer-loop solver, tfcompile/ir.py LAYER_SOLVERS,
    if it registered one): what the calibration loop needs to solve each layer as it goes, on
    `device`, and to give each rank whole groups of `expert_batch` MoE experts."""
    algorithm: str
    settings: Any = field(compare=False)  # the algorithm's settings, handed to its solver unread
    device: str = "auto"
    expert_batch: int = 8


@dataclass(frozen=True)
class ScaleSearch:
    """Pack will choose NVFP4/MXFP4 scales by output error (quantize.scale_search=output): per weight of
    a format it scores `roundings(weight quantizer)` candidate roundings (0: that format is not
    searched), a group's candidates side by side on the process's cores (passes/quantize/output_scales.py)."""
    roundings: Callable[[Any], int] = field(compare=False)


@dataclass(frozen=True)
class OnlineTransform:
    """Every quantized Linear is stored as W R for an online block-Hadamard transform of `order` that the
    engine applies to its input (quantize.online_hadamard: tfcompile/rotate/online.py)."""
    order: int


@dataclass(frozen=True)
class ExtraViews:
    """Views of the weights written beside the artifact (e.g. the modelopt view), one scheme each."""
    views: tuple[str, ...]


@dataclass(frozen=True)
class TrainsOnTheSource:
    """The pass trains against the source model as loaded: a pass that rewrites the weights before
    it (a rotation) would change its teacher. `settings`: its config, which `plan --estimate`'s
    training memory model reads (tfcompile/estimate/distill.py)."""
    by: str
    settings: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class SingleScheme:
    """The pass handles one quantization scheme for every layer (mixed precision cannot feed it)."""
    by: str

