"""The typed facts passes hand each other: model info, the quantization plan, calibration
statistics, the lazy output program, and the artifact written.

Every type a pass produces or another consumes lives here, low in the import tree
(docs/design.md "Layers"), so the pipeline's `Context` is fully typed and no library module
imports a pass to learn a type. The flow:

    load -> ModelInfo   select -> QuantPlan (QuantGroup of QuantTarget)   calibrate -> CalibStats
    quantize -> Program (Job -> OutSpec)   pack -> ArtifactInfo

`quantize` does not hold quantized tensors (a 100 GB model would not fit): it produces a
`Program`, an ordered tuple of jobs, each naming its source tensors and the exact output
tensors (name, dtype, shape) it yields. `pack` plans shards from the specs, then `execute`s
one job at a time, so peak memory follows the largest fusion group, not the model. How a
group's tensors are computed is the program's algorithm (`ALGORITHMS`, each registered by its
module under passes/quantize/); the IR names none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

import torch

from tfcompile.families.experts import take
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.jsonfile import JsonDict
from tfcompile.kernels.formats import WeightQuantizer
from tfcompile.reporter import Reporter
from tfcompile.schemes import Scheme

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def torch_dtype(code: str) -> torch.dtype:
    """Model compute dtype for a safetensors code (bf16 unless fp16/fp32)."""
    return _DTYPES.get(code, torch.bfloat16)


# -- load ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    architecture: str  # config.json architectures[0], e.g. "LlamaForCausalLM"
    model_type: str
    hidden_size: int | None
    num_layers: int | None
    moe_intermediate: int | None  # per-expert intermediate size, for fused expert tensors
    tie_word_embeddings: bool
    dtype: str  # dominant dtype of the source tensors (safetensors code, e.g. "BF16")

    @staticmethod
    def from_config(cfg: Mapping[str, Any], dtype: str) -> "ModelInfo":
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        arch = (cfg.get("architectures") or ["unknown"])[0]
        return ModelInfo(
            architecture=str(arch),
            model_type=str(cfg.get("model_type", "unknown")),
            hidden_size=text.get("hidden_size"),
            num_layers=text.get("num_hidden_layers"),
            moe_intermediate=text.get("moe_intermediate_size") or text.get("intermediate_size"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            dtype=dtype,
        )


# -- select --------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantTarget:
    module: str  # output module name, e.g. model.layers.0.self_attn.q_proj
    source: str  # source tensor name
    expert: int | None  # index along dim 0 of a fused 3-D expert tensor
    rows: tuple[int, ...] | None  # (start, stop[, step]) rows of that slice (gate vs up; GPT-OSS interleaved)
    shape: tuple[int, int]  # (N out_features, K in_features)
    # A layout view Linear (tfcompile/layout): ((member target, source rows), ...) gathered and
    # concatenated in this order; empty for an ordinary Linear.
    parts: tuple[tuple["QuantTarget", tuple[int, ...]], ...] = ()
    transposed: bool = False  # the fused tensor stores (in, out): the slice is the weight's transpose


@dataclass(frozen=True)
class QuantGroup:
    key: str  # e.g. model.layers.0.self_attn.qkv
    members: tuple[QuantTarget, ...]


# One expert's slice of a fused bias (GPT-OSS): (output tensor name, expert, rows or None)
Split = tuple[str, int, Optional[tuple[int, ...]]]


@dataclass(frozen=True)
class QuantPlan:
    scheme: Scheme
    groups: tuple[QuantGroup, ...]
    passthrough: tuple[str, ...]  # source tensors copied verbatim
    ignore: tuple[str, ...]  # Linear module names left unquantized (config.json `ignore`)
    embeddings: tuple[str, ...]  # embedding modules (modelopt lists them in exclude_modules)
    sources: frozenset[str]  # source tensors consumed by quantized groups
    # fused per-expert biases split like their weights: source tensor -> its splits, in expert order
    splits: Mapping[str, tuple[Split, ...]] = field(default_factory=dict)
    family: str = "generic"  # tfcompile/families/rules.py: the rules that applied
    # mixed precision (passes/mixed.py): group key -> its scheme where it is not `scheme`
    group_schemes: Mapping[str, Scheme] = field(default_factory=dict)
    mixed: JsonDict | None = None  # the mixed-precision search's record (the manifest's "mixed")

    def targets(self) -> list[QuantTarget]:
        return [t for g in self.groups for t in g.members]

    def scheme_of(self, group: QuantGroup) -> Scheme:
        """The scheme a group is quantized with: its mixed-precision choice, else the plan's."""
        return self.group_schemes.get(group.key, self.scheme)

    def schemes(self) -> list[Scheme]:
        """Every scheme in use, the plan's first (one entry unless mixed precision chose others)."""
        out = [self.scheme]
        for g in self.groups:
            if (s := self.scheme_of(g)) not in out:
                out.append(s)
        return out


# -- calibrate -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibStats:
    input_amax: Mapping[str, float]  # Linear module name -> max |x| of its input, over all tokens
    tokens: int  # calibration tokens seen
    source: str  # where the tokens came from, e.g. "random-tokens(seed=0)"
    fallback: tuple[str, ...] = field(default=())  # modules no token reached (scale from a fallback)
    # attention module -> (max|K|, max|V|), float32 [kv_heads] each, post-RoPE as cached
    kv_amax: Mapping[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    kv_strategy: str | None = None  # None (no KV quantization) | "tensor" | "attn_head"
    kv_format: str = "fp8"  # the KV cache's format: "fp8" (E4M3) | "nvfp4" (E2M1, E4M3 scales per 16)
    # the registered statistics recorded (calibration/statistics.py): name -> its result, read back
    # through the accessor of the statistic's module (a per-group one: group key -> tensor, lazy
    # when the layer loop spilled it, `owner(key)` under torchrun)
    statistics: Mapping[str, Any] = field(default_factory=dict)
    seconds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # statistic -> group key -> s
    layer_seconds: tuple[float, ...] = ()  # layer-by-layer loop: wall seconds per decoder layer
    # MoE (calibration/moe.py): routed tokens per expert "{experts module}.{e}"; whether every token
    # also went through every expert for the statistics; experts below moe_min_tokens take the
    # layer's max over experts (calibration/moe_policy.py) and lose their per-group statistics (-> RTN)
    expert_tokens: Mapping[str, int] = field(default_factory=dict)
    moe_all_experts: bool = False
    moe_min_tokens: int = 0
    # solved in the layer loop by the algorithm's layer solver (calibrate.propagate, learned rounding:
    # calibration/propagate.py): group key -> the packed codes (QTensor.data) of its members,
    # concatenated on dim 0 (signround: codes then block scales per row, passes/quantize/signround.py
    # `codes_of`) (lazy: spilled; under torchrun every group's key, `owner(key)` the rank holding
    # it). The per-group statistics the solver consumed are then empty.
    solved: Mapping[str, torch.Tensor] = field(default_factory=dict)
    # why `--calib auto` passed over the first text source (calibration.datasets.fallback_message); ""
    # when it did not. The manifest and the report record it: the statistics depend on it
    data_fallback: str = ""
    tokens_sha256: str = ""  # of the calibration token ids (calibration.datasets.tokens_sha256); "" if none
    # the torch dtype name the forwards computed in (calibrate.dtype resolved: tfcompile/machine.py)
    compute_dtype: str = ""


# -- quantize ------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Job:
    group: QuantGroup | None  # a fusion group, or None for a verbatim copy / a computed constant
    source: str | None  # the tensor copied verbatim when group is None
    outputs: tuple[OutSpec, ...]  # in write order
    const: torch.Tensor | None = None  # a small tensor computed by the pass itself (e.g. a KV-cache scale)
    # (expert, rows): the slice of `source` a copy takes (a fused expert bias, per expert)
    part: tuple[int, Optional[tuple[int, ...]]] | None = None
    scheme: Scheme | None = None  # mixed precision: this group's scheme when it is not Program.scheme

    @property
    def kind(self) -> str:
        """"group": quantize a fusion group; "copy": a source tensor verbatim; "override": a
        source tensor replaced by `const` (same name, dtype, shape; e.g. a norm weight with a scale
        folded in); "const": a tensor of the pass's own (e.g. a KV-cache scale)."""
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
    # the calibration statistics (CalibStats.statistics), read by the algorithm through each
    # statistic's accessor (calibration/statistics.py); a per-group one may be lazy (spilled)
    statistics: Mapping[str, Any] = field(default_factory=dict)
    # the algorithm's own settings: the quantize fields named `{algorithm}_{option}`, by option
    settings: Mapping[str, Any] = field(default_factory=dict)
    # what the algorithm's `prepare` decided per group key (e.g. a fold), and why a group stays RTN
    prepared: Mapping[str, Any] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    # per-run working memory of an algorithm (e.g. a batch of solved experts until written)
    scratch: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    device: Any = "cpu"  # torch.device of the algorithm's solves and searches (quantize.device)
    # NVFP4 weights under the recipe's block-scale rule when it is not the scheme's own
    # (quantize.nvfp4_scales=four_over_six: passes/quantize/four_over_six.py); None: Scheme.weights
    nvfp4_weights: WeightQuantizer | None = None
    kv_format: str = "fp8"  # "fp8" | "nvfp4" (calibrate.kv_cache): same k_scale/v_scale, another cache
    solved: Mapping[str, torch.Tensor] = field(default_factory=dict)  # CalibStats.solved: the layer loop's codes
    # "none" | "output": NVFP4/MXFP4 scales chosen by the layer's output error under the group's
    # input second moment (quantize.scale_search: passes/quantize/output_scales.py)
    scale_search: str = "none"
    # order b of the online block-Hadamard transform inside every quantized Linear's K (0: none): the
    # algorithms quantize W R under R^T H R (tfcompile/rotate/online.py, quantize.online_hadamard)
    online_hadamard: int = 0

    def owner(self, key: str) -> int | None:
        """Under torchrun: the rank that holds what group `key` is computed from, its solved codes or
        a per-group statistic's tensor (None: any rank)."""
        for held in (self.solved, *self.statistics.values()):
            owner = getattr(held, "owner", None)
            if owner is not None and (rank := owner(key)) is not None:
                return rank
        return None

    @property
    def weights(self) -> WeightQuantizer:
        """The weight quantizer every algorithm quantizes a group with: the scheme's, or for an
        NVFP4 scheme `nvfp4_weights` when the recipe chose another block-scale rule."""
        w = self.scheme.weights
        alt = self.nvfp4_weights  # it states the format it replaces
        return alt if alt is not None and w.format == alt.format else w

    def specs(self) -> list[OutSpec]:
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


# -- how a program's groups are computed -----------------------------------------------------
LayerStats = JsonDict  # per quantized Linear: module, format, shape, sqnr_db (+ the algorithm's figures)
RunFn = Callable[[Job, Program, Checkpoint], tuple[dict[str, torch.Tensor], list[LayerStats]]]


class PrepareFn(Protocol):
    """Work an algorithm does once, when the quantize pass plans, before pack streams the jobs
    (e.g. a scale search and norm folds): returns the program to run and pass statistics."""

    def __call__(self, plan: QuantPlan, calib: Optional[CalibStats], source: Checkpoint, program: Program,
                 reporter: Reporter) -> tuple[Program, JsonDict]: ...


@dataclass(frozen=True)
class Algorithm:
    name: str
    run: RunFn  # (job, program, source) -> (tensors by output name, per-Linear stats)
    prepare: PrepareFn | None = None
    # why the algorithm cannot quantize a scheme (None: it can)
    supports: Callable[[Scheme], "str | None"] | None = None
    hint: str = ""  # what to do instead, when `supports` says no
    # the calibrate settings that record the statistics it reads (e.g. {"statistics": ("name",)}:
    # calibration/statistics.py); the quantize pass implies them, so choosing the algorithm
    # schedules its calibration
    calibrate: Mapping[str, Any] = field(default_factory=dict)
    cost: "SolveCost | None" = None  # its solves' cost for `plan --estimate` (None: nothing beyond RTN's)


@dataclass(frozen=True)
class SolveCost:
    """What an algorithm's solves cost, for `tfcompile plan --estimate` (tfcompile/estimate/plan.py
    adds them up, naming no algorithm). One solve per member of every group the calibrate pass
    records a second-moment statistic for; they run in the pack pass (each rank its owned groups),
    or in the calibrate pass's layer loop when the algorithm's layer solver runs there
    (`register_layer_solver(loop="propagate")` with calibrate.propagate)."""
    # (n, k, accelerator or None on CPU (tfcompile/estimate/throughputs.py ACCELERATORS), this machine's
    # figures (throughputs.py this_machine()), solves sharing one sweep) -> seconds of one [n, k] solve
    seconds: Callable[[int, int, Any, Mapping[str, Any], int], float]
    peak_bytes: Callable[[int, int], int]  # (n, k) -> bytes one [n, k] solve holds at its peak
    # True: a routed expert group's members solve quantize's expert batch at a time, in one sweep
    # (`together` = batch x members) and that many at once in memory; False: one by one
    batches_experts: bool = False


ALGORITHMS: dict[str, Algorithm] = {}


@dataclass(frozen=True)
class LayerSolverSpec:
    """An algorithm's solver for the calibrate pass's layer loop (calibration/propagate.py
    `LayerSolver`), built with (plan, quantize config, source, model dtype, device)."""
    cls: type
    # "always": the loop runs it on every block (e.g. learned rounding); "propagate": only with
    # calibrate.propagate (its statistics are otherwise the unquantized model's, solved in pack)
    loop: str


LAYER_SOLVERS: dict[str, LayerSolverSpec] = {}


def register_layer_solver(algorithm: str, *, loop: str):
    """Class decorator: the layer-loop solver of `algorithm` (the calibrate pass asks here,
    naming no algorithm)."""
    if loop not in ("always", "propagate"):
        raise ValueError(f"algorithm {algorithm!r}: loop must be 'always' or 'propagate', not {loop!r}")

    def wrap(cls: type) -> type:
        LAYER_SOLVERS[algorithm] = LayerSolverSpec(cls, loop)
        return cls

    return wrap


def register_algorithm(name: str, *, prepare: PrepareFn | None = None,
                       supports: Callable[[Scheme], "str | None"] | None = None, hint: str = "",
                       calibrate: Mapping[str, Any] | None = None, cost: SolveCost | None = None):
    """Decorator: register `run` as algorithm `name` (quantize.algorithm); `calibrate`: the
    calibrate settings its statistics need (none: a data-free algorithm); `cost`: its solves'
    cost for `plan --estimate` (none: it costs what round-to-nearest does)."""
    def wrap(fn: RunFn) -> RunFn:
        ALGORITHMS[name] = Algorithm(name, fn, prepare, supports, hint, dict(calibrate or {}), cost)
        return fn

    return wrap


def execute(job: Job, program: Program, source: Checkpoint) -> tuple[dict[str, torch.Tensor], list[LayerStats]]:
    """Compute one job's output tensors (a verbatim copy is a memory-mapped view)."""
    if job.const is not None:
        return {job.outputs[0].name: job.const}, []
    if job.group is None:
        if job.part is not None:  # one expert's slice of a fused tensor (tfcompile/families/experts.py)
            return {job.outputs[0].name: take(source.get(job.source), *job.part)}, []
        return {job.source: source.get(job.source)}, []
    if job.scheme is not None:  # a mixed-precision group: the algorithm runs under its own scheme
        program = dataclasses.replace(program, scheme=job.scheme)
    return ALGORITHMS[program.algorithm].run(job, program, source)


def load_target(source: Checkpoint, target: QuantTarget) -> torch.Tensor:
    """The [N, K] weight of one target: a whole tensor or a slice of fused experts, or for a
    layout view Linear (`target.parts`) its members' rows gathered and concatenated."""
    if target.parts:  # rows are gathered *before* quantization (tfcompile/layout/heads.py)
        return torch.cat([load_target(source, t)[torch.tensor(rows)] for t, rows in target.parts])
    if target.expert is not None:  # one expert (a published source decodes only that one)
        return take(source.get_expert(target.source, target.expert), None, target.rows, target.transposed)
    return take(source.get(target.source), None, target.rows, target.transposed)


# -- pack ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArtifactInfo:
    path: Path  # staging directory
    files: dict[str, str]  # relative path -> sha256, every file written (the manifest's `files`)
    sources: dict[str, str]  # source file name -> sha256
    layers: tuple[LayerStats, ...]  # per quantized Linear: module, format, shape, sqnr_db
    bytes_in: int  # source bytes of the tensors written
    bytes_out: int  # bytes of the compressed-tensors view's tensors
    views: tuple[str, ...] = field(default=("compressed-tensors",))

    def with_files(self, files: Mapping[str, str], views: tuple[str, ...] = ()) -> "ArtifactInfo":
        """This artifact with more files (relative path -> sha256) and views, e.g. kernels."""
        return dataclasses.replace(self, files=dict(sorted({**self.files, **files}.items())),
                                   views=self.views + tuple(views))
