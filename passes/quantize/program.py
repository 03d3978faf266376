"""The lazy output program: what pack writes, in order, and how to compute it.

`quantize` passes do not hold quantized tensors (a 100 GB model would not
fit). They produce a `Program`: an ordered tuple of jobs, each naming its
source tensors and the exact output tensors (name, dtype, shape) it yields.
`pack` plans shards from the specs, then executes one job at a time, so peak
memory follows the largest fusion group, not the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from tfcompile.families.experts import take
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
    part: Any = None  # (expert, rows): the slice of `source` a copy takes (a fused expert bias, per expert)
    scheme: Any = None  # mixed precision: this group's Scheme when it is not Program.scheme

    @property
    def kind(self) -> str:
        """"group": quantize a fusion group; "copy": a source tensor verbatim; "override": a
        source tensor replaced by `const` (same name, dtype, shape; e.g. an AWQ-folded norm
        weight); "const": a tensor of the pass's own (e.g. a KV-cache scale)."""
        if self.group is not None:
            return "group"
        if self.source is None:
            return "const"
        return "copy" if self.const is None else "override"


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
    awq: Mapping[str, Any] = field(default_factory=dict)  # group key -> passes.quantize.awq.AWQFold
    awq_skipped: Mapping[str, str] = field(default_factory=dict)  # group key -> why it stays RTN
    gptq_expert_batch: int = 8  # gptq: routed experts of one shape solved together (gptq_moe.py)
    # per-run working memory of an algorithm (gptq_moe.py: a batch of solved experts until written)
    scratch: dict = field(default_factory=dict, compare=False, repr=False)
    nvfp4_scales: str = "max"  # NVFP4 block-scale rule: "max" | "four_over_six" (four_over_six.py)
    kv_format: str = "fp8"  # "fp8" | "nvfp4" (calibrate.kv_cache): same k_scale/v_scale, another cache

    def specs(self) -> list:
        return [o for j in self.jobs for o in j.outputs]

    def with_overrides(self, tensors: Mapping[str, torch.Tensor]) -> "Program":
        """This program with the verbatim copies of `tensors` (source names) replaced by the
        given values, in both views. Each must match its source tensor's dtype and shape."""
        jobs, left = [], dict(tensors)
        for j in self.jobs:
            t = left.pop(j.source, None) if j.kind == "copy" else None
            if t is not None:
                spec = j.outputs[0]
                if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                    raise ValueError(f"override of {j.source}: {t.dtype} {tuple(t.shape)} does not "
                                     f"match the source's {spec.dtype} {spec.shape}")
                j = dataclasses.replace(j, const=t)
            jobs.append(j)
        if left:
            raise ValueError(f"no verbatim copy to override for {sorted(left)[:3]}")
        return dataclasses.replace(self, jobs=tuple(jobs))


# algorithm name -> fn(job, program, source) -> (tensors by output name, per-layer stats)
ALGORITHMS: dict[str, Callable[..., tuple[dict[str, torch.Tensor], list[dict]]]] = {}
# algorithm name -> fn(ctx, program, reporter) -> (program, stats): work done once, when the
# quantize pass plans, before pack streams the jobs (AWQ's scale search and norm folds)
PREPARE: dict[str, Callable[..., tuple["Program", dict]]] = {}
# algorithm name -> fn(scheme) -> None, raising RecipeError for a format it cannot handle
SUPPORTS: dict[str, Callable[[Scheme], None]] = {}


def register_algorithm(name: str, *, prepare=None, supports=None):
    def wrap(fn):
        ALGORITHMS[name] = fn
        if prepare is not None:
            PREPARE[name] = prepare
        if supports is not None:
            SUPPORTS[name] = supports
        return fn

    return wrap


def execute(job: Job, program: Program, source) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Compute one job's output tensors (a verbatim copy is a memory-mapped view)."""
    if job.const is not None:
        return {job.outputs[0].name: job.const}, []
    if job.group is None:
        if job.part is not None:  # one expert's slice of a fused tensor (tfcompile/families/experts.py)
            return {job.outputs[0].name: take(source.get(job.source), *job.part)}, []
        return {job.source: source.get(job.source)}, []
    if job.scheme is not None:  # a mixed-precision group: the algorithm runs under its own scheme
        program = dataclasses.replace(program, scheme=job.scheme)
    return ALGORITHMS[program.algorithm](job, program, source)


def load_target(source, target) -> torch.Tensor:
    """The [N, K] weight of one target: a whole tensor or a slice of fused experts, or for a
    layout view Linear (`target.parts`) its members' rows gathered and concatenated."""
    if target.parts:  # rows are gathered *before* quantization (tfcompile/layout/heads.py)
        return torch.cat([load_target(source, t)[torch.tensor(rows)] for t, rows in target.parts])
    if target.expert is not None and hasattr(source, "get_expert"):  # decode one expert, not the layer's
        return take(source.get_expert(target.source, target.expert), None, target.rows, target.transposed)
    return take(source.get(target.source), target.expert, target.rows, target.transposed)
