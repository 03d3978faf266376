"""The lazy output program: what pack writes, in order, and how to compute it.

`quantize` passes do not hold quantized tensors (a 100 GB model would not
fit). They produce a `Program`: an ordered tuple of jobs, each naming its
source tensors and the exact output tensors (name, dtype, shape) it yields.
`pack` plans shards from the specs, then executes one job at a time, so peak
memory follows the largest fusion group, not the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from tfcompile.passes.quantize.naming import OutSpec  # noqa: F401  (re-export)

from tfcompile.schemes import Scheme

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def torch_dtype(code: str) -> torch.dtype:
    """Model compute dtype for a safetensors code (bf16 unless fp16/fp32)."""
    return _DTYPES.get(code, torch.bfloat16)


@dataclass(frozen=True)
class Job:
    group: Any  # passes.select.QuantGroup, or None for a verbatim copy / a computed constant
    source: str | None  # the tensor copied verbatim when group is None
    outputs: tuple  # tuple[OutSpec, ...] in write order
    const: Any = None  # a small tensor computed by the pass itself (e.g. a KV-cache scale)


@dataclass(frozen=True)
class Program:
    scheme: Scheme
    algorithm: str  # key into ALGORITHMS: how a group's tensors are computed
    jobs: tuple[Job, ...]
    act_amax: Mapping[str, float]  # module -> calibrated input amax (static-activation schemes)
    mx_rule: str  # MX shared-exponent rule, recorded in the manifest with the data
    sqnr_rows: int  # rows sampled per Linear for the weight-SQNR figure
    kv_strategy: str | None = None  # KV-cache scales: None | "tensor" | "attn_head"
    kv_modules: tuple[str, ...] = ()  # attention modules that got k_scale / v_scale
    hessians: Mapping[str, Any] = field(default_factory=dict)  # group key -> H [K, K] (gptq)
    gptq_act_order: bool = True
    gptq_damp: float = 0.01

    def specs(self) -> list:
        return [o for j in self.jobs for o in j.outputs]


# algorithm name -> fn(job, program, source) -> (tensors by output name, per-layer stats)
ALGORITHMS: dict[str, Callable[..., tuple[dict[str, torch.Tensor], list[dict]]]] = {}


def register_algorithm(name: str):
    def wrap(fn):
        ALGORITHMS[name] = fn
        return fn

    return wrap


def execute(job: Job, program: Program, source) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Compute one job's output tensors (a verbatim copy is a memory-mapped view)."""
    if job.const is not None:
        return {job.outputs[0].name: job.const}, []
    if job.group is None:
        return {job.source: source.get(job.source)}, []
    return ALGORITHMS[program.algorithm](job, program, source)


def load_target(source, target) -> torch.Tensor:
    """The [N, K] weight of one target: a whole tensor or a slice of fused experts."""
    w = source.get(target.source)
    if target.expert is not None:
        w = w[target.expert]
    if target.rows is not None:
        w = w[target.rows[0]: target.rows[1]]
    return w
