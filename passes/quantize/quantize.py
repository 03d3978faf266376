"""`quantize`: plan every output tensor of the artifact as a lazy `Program` (tfcompile/ir.py).

No weight is quantized here: each fusion group becomes a job that names its outputs (the
compressed-tensors names, dtypes and shapes of tfcompile/artifact/naming.py) and is
computed later, one at a time, by pack with the recipe's algorithm (`quantize.algorithm`:
rtn.py, mse.py, gptq.py, awq.py; registered in tfcompile.ir.ALGORITHMS). Every other source
tensor is a verbatim copy, and a calibrated FP8 KV cache adds its k_scale / v_scale.
An algorithm with plan-time work (AWQ's search) does it here, before pack streams anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping

import torch

from tfcompile.artifact.naming import ct_outputs
from tfcompile.calibration.hessian import hessians as calib_hessians
from tfcompile.calibration.record import CALIB
from tfcompile.dist.devices import check_device, resolve_device
from tfcompile.errors import RecipeError
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.dtypes import torch_dtype_of
from tfcompile.ir import ALGORITHMS, CalibStats, Job, OutSpec, Program, QuantGroup, QuantPlan, Split, torch_dtype
from tfcompile.kernels.formats import E4M3_MAX, round_scale_up
from tfcompile.passes.quantize import four_over_six, output_scales
from tfcompile.passes.quantize.online import check_online, online_unsupported
from tfcompile.pipeline.intents import LayerSolve, OnlineTransform, ScaleSearch, WeightRounding
from tfcompile.pipeline.passes import PassResult, Selection, Unsupported, register_pass
from tfcompile.recipe import Recipe
from tfcompile.schemes import SCHEMES

MX_RULES = ("floor", "ceil")
NVFP4_SCALE_RULES = ("max", "four_over_six")  # quantize.nvfp4_scales (four_over_six.py)


@dataclass(frozen=True)
class QuantizeConfig:
    # "rtn" | "mse" (block-scale search, mse.py) | "gptq" (gptq.py) | "awq" (awq.py) | "signround" (signround.py)
    algorithm: str = "rtn"
    gptq_act_order: bool = True  # gptq: visit columns by decreasing diag(H)
    gptq_damp: float = 0.01  # gptq: fraction of mean diag(H) added to the diagonal
    gptq_expert_batch: int = 8  # gptq: MoE experts of one shape solved together (memory: that many experts)
    mx_rule: str = ""  # "floor" | "ceil"; empty = the formats module default
    nvfp4_scales: str = "max"  # NVFP4 block scales: "max" (block max -> 6) | "four_over_six" (four_over_six.py)
    # NVFP4/MXFP4 scales: "none" (RTN's, from maxima) | "output" (global and block scales chosen by the layer's
    # output error on the calibration activations, output_scales.py; rtn and gptq; schedules calibrate's Hessians)
    # | "gptq" (gptq only: candidates scored by the output error after each one's GPTQ solve, gptq.py solved_search)
    scale_search: str = "none"
    # signround (signround.py): signed-gradient steps per decoder block, their initial step (0: 1 / iters,
    # auto-round's default, decayed linearly to 0) and the seed of the batch order
    signround_iters: int = 200
    signround_lr: float = 0.0
    signround_seed: int = 0
    # signround: tune the block scales' factors too (default off: on the demo LM they held the block loss at
    # -9% where the rounding offsets alone reached -63%: docs/accuracy.md)
    signround_scales: bool = False
    sqnr_rows: int = 16  # rows per Linear sampled for the manifest's weight SQNR (0 = all)
    # order b of an online block-Hadamard transform inside every quantized Linear's K (0: none): the
    # weights are stored as W R (R = I (x) H_b / sqrt(b)), the engine applies x R at run time, from the
    # transform_config written into config.json (tfcompile/rotate/online.py; vLLM only)
    online_hadamard: int = field(default=0, metadata={"omit_default": True})
    # GPTQ solves and the AWQ search run here (--device); the packed bytes are encoded on the CPU
    device: str = field(default="auto", metadata={"runtime": True})

    def __post_init__(self) -> None:
        check_device(self.device, "quantize.device")
        if self.signround_iters < 1 or self.signround_lr < 0:
            raise RecipeError(f"quantize.signround_iters {self.signround_iters} must be >= 1 and "
                              f"quantize.signround_lr {self.signround_lr} >= 0",
                              hint="e.g. --set quantize.signround_iters=200 (signround_lr 0: 1 / iters)")


def _supports(recipe: Recipe, cfg: QuantizeConfig) -> list[Unsupported]:
    """An algorithm that declares its formats rejects the others before anything runs."""
    algo = ALGORITHMS.get(cfg.algorithm)
    fmt = recipe.quant_format()
    reasons = []
    if cfg.nvfp4_scales not in NVFP4_SCALE_RULES:
        reasons.append(Unsupported(f"quantize.nvfp4_scales {cfg.nvfp4_scales!r} is unknown",
                                   "choose one of: " + ", ".join(NVFP4_SCALE_RULES)))
    elif cfg.nvfp4_scales != "max" and fmt in SCHEMES and SCHEMES[fmt].weight != four_over_six.WEIGHTS.format:
        reasons.append(Unsupported(f"quantize.nvfp4_scales {cfg.nvfp4_scales} needs an NVFP4 format, not {fmt}",
                                   "use --format nvfp4 or nvfp4a16, or drop the setting"))
    reasons += _scale_search_unsupported(cfg, fmt)
    reasons += online_unsupported(recipe, cfg, SCHEMES.get(fmt))
    if algo is None or algo.supports is None or fmt not in SCHEMES:
        return reasons
    reason = algo.supports(SCHEMES[fmt])
    return reasons + ([Unsupported(reason, algo.hint)] if reason else [])


def _scale_search_unsupported(cfg: QuantizeConfig, fmt: str) -> list[Unsupported]:
    """quantize.scale_search=output|gptq: NVFP4/MXFP4 weights, the rtn (output only) or gptq algorithm, max
    block scales."""
    if cfg.scale_search == "none":
        return []
    if cfg.scale_search not in output_scales.MODES:
        return [Unsupported(f"quantize.scale_search {cfg.scale_search!r} is unknown",
                            "choose one of: " + ", ".join(output_scales.MODES))]
    if fmt in SCHEMES and not output_scales.searchable(SCHEMES[fmt].weights):
        return [Unsupported(f"quantize.scale_search={cfg.scale_search} needs NVFP4 or MXFP4 weights, not {fmt}",
                            "use an nvfp4* or mxfp4* format, or drop the setting")]
    if cfg.algorithm not in ("rtn", "gptq") or cfg.nvfp4_scales != "max":
        return [Unsupported(f"quantize.scale_search={cfg.scale_search} chooses RTN's and GPTQ's scales, not those "
                            f"of algorithm {cfg.algorithm} with nvfp4_scales {cfg.nvfp4_scales}",
                            "use --algorithm rtn or gptq with the default nvfp4_scales, or drop the setting")]
    if cfg.scale_search == "gptq" and cfg.algorithm != "gptq":  # it scores candidates after GPTQ's solve
        return [Unsupported(f"quantize.scale_search=gptq scores scales after a GPTQ solve, and algorithm "
                            f"{cfg.algorithm} solves none", "use --algorithm gptq, or quantize.scale_search=output")]
    return []


def _implies(sel: Selection) -> dict:
    """A calibrated algorithm schedules calibration and asks it for its statistics (the settings it
    registered: `register_algorithm(calibrate=...)`); so does quantize.scale_search=output (the
    Hessians it scores scales with), which is also RTN's default where the format calibrates
    anyway (`_searched_by_default`)."""
    table = sel.settings.get("quantize")
    table = table if isinstance(table, dict) else {}  # another type is reported by QuantizeConfig
    algorithm = table.get("algorithm", QuantizeConfig.algorithm)
    algo = ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
    extra = dict(algo.calibrate) if algo is not None and algo.calibrate else None
    own = {"scale_search": "output"} if "scale_search" not in table and _searched_by_default(sel, table) else {}
    if table.get("scale_search", own.get("scale_search")) == "output" and not (extra or {}).get("hessian"):
        # the search scores with H's diagonal blocks alone: record just those (calibration/hessian.py `blocks`)
        blocks = sel.scheme.weights.block[0] if sel.scheme is not None and output_scales.searchable(
            sel.scheme.weights) else 0
        extra = {**(extra or {}), "hessian": True, **({"hessian_blocks": blocks} if blocks else {})}
    return {**({"calibrate": extra} if extra else {}), **({"quantize": own} if own else {})}


def _searched_by_default(sel: Selection, table: dict) -> bool:
    """RTN of W4A4 NVFP4 (static input scales: the run calibrates anyway) chooses its scales by output
    error unless told otherwise: on SmolLM2, the demo LM and demo-gemma it lowered held-out KL against
    max-based scales on every calibration draw (docs/accuracy.md "Defaults across models"). Weight-only
    RTN stays data-free; GPTQ keeps RTN's scales (scale search did not help it there); distillation
    trains against max-based scales, so it keeps them."""
    scheme = sel.scheme
    return (scheme is not None and scheme.act_static and not sel.given("distill")
            and not sel.value("calibrate", "propagate")  # the layer loop's RTN keeps RTN's scales
            and output_scales.searchable(scheme.weights)
            and table.get("algorithm", QuantizeConfig.algorithm) == "rtn"
            and table.get("nvfp4_scales", QuantizeConfig.nvfp4_scales) == "max")


def _intents(cfg: QuantizeConfig) -> tuple:
    """What the other passes may know before quantize runs: how weights round, and what the
    calibration loop hands the algorithm's layer solver (tfcompile/pipeline/intents.py)."""
    return (WeightRounding(cfg.algorithm, cfg.mx_rule),
            LayerSolve(cfg.algorithm, cfg, cfg.device, cfg.gptq_expert_batch),
            *((OnlineTransform(cfg.online_hadamard),) if cfg.online_hadamard else ()),
            *((ScaleSearch(output_scales.scored_roundings),) if cfg.scale_search == "output" else ()))


@register_pass("quantize", config=QuantizeConfig, requires=("source", "model", "plan"), produces=("program",),
               supports=_supports, implies=_implies, intents=_intents)
def quantize(ctx, cfg: QuantizeConfig, reporter) -> PassResult:
    """Plan every output tensor (names, dtypes, shapes); pack computes them with quantize.algorithm."""
    plan, model_dtype = ctx.plan, torch_dtype(ctx.model.dtype)
    scheme = plan.scheme
    # copies first: the writer thread copies them (embeddings, lm_head: ~0.2 s for a 0.9B model) while the
    # groups quantize, where last they trailed the run (bench/startup.py: RTN -0.26 s of ~2.7 s)
    jobs = [Job(None, name, (OutSpec(name, torch_dtype_of(info.dtype), tuple(info.shape)),))
            for name, info in ((n, ctx.source.info(n)) for n in plan.passthrough)]
    jobs += split_jobs(ctx.source, plan.splits)
    jobs += [group_job(g, plan, model_dtype) for g in plan.groups]
    calib = ctx.get(CALIB)  # None: a recipe's own pipeline without calibrate (weights only)
    act = dict(calib.input_amax) if calib is not None else {}
    missing = [t.module for g in plan.groups if plan.scheme_of(g).act_static
               for t in g.members if t.module not in act]
    if missing and calib is None:  # a recipe's own `pipeline` without calibrate: the user's recipe
        raise RecipeError(f"{scheme.name} quantizes activations with static scales, which the calibrate pass "
                          "measures, and the recipe's pipeline has no calibrate",
                          hint='add "calibrate" to the recipe\'s pipeline before "quantize", or drop `pipeline` '
                               "to run the format's preset")
    if missing:
        raise RuntimeError(f"{scheme.name} needs calibrated input scales; none for {missing[:3]}")
    rule = mx_rule(cfg, scheme)
    kv_jobs = kv_scale_jobs(calib, model_dtype)
    kv_strategy = calib.kv_strategy if kv_jobs else None
    kv_modules = tuple(sorted(calib.kv_amax)) if kv_jobs else ()
    algo = ALGORITHMS.get(cfg.algorithm)
    if algo is None:
        raise RecipeError(f"quantize.algorithm {cfg.algorithm!r} is unknown",
                          hint="choose one of: " + ", ".join(sorted(ALGORITHMS)))
    hessians = calib_hessians(calib)  # lazy: may be spilled to disk
    codes = calib.solved if calib is not None else {}  # solved by calibrate's layer loop
    if cfg.algorithm == "gptq" and not hessians and not codes:
        raise RecipeError("quantize.algorithm gptq needs Hessians from the calibrate pass",
                          hint="use --algorithm gptq (it schedules calibrate with hessian=true)")
    if cfg.algorithm == "signround" and not codes:
        raise RecipeError("quantize.algorithm signround tunes each block in the calibrate pass's layer loop, "
                          "which did not run", hint="use --algorithm signround (it schedules calibrate with "
                                                    "mode=sequential); the model must load layer by layer")
    device = resolve_device(cfg.device, ctx.world) if cfg.algorithm != "rtn" else "cpu"
    program = Program(scheme, cfg.algorithm, tuple(jobs + kv_jobs), act, rule, cfg.sqnr_rows,
                      kv_strategy, kv_modules, statistics=dict(calib.statistics) if calib is not None else {},
                      settings=algorithm_settings(cfg, cfg.algorithm), device=device,
                      nvfp4_weights=nvfp4_weights(cfg), kv_format=calib.kv_format if kv_jobs else "fp8",
                      solved=codes, scale_search=cfg.scale_search, online_hadamard=cfg.online_hadamard)
    check_online(plan, program)
    extra = {}
    if algo.prepare is not None:  # plan-time work of the algorithm (AWQ: search and fold)
        program, extra = algo.prepare(plan, calib, ctx.source, program, reporter)
    return PassResult(ctx.with_(program=program),
                      {"jobs": len(jobs), "outputs": len(program.specs()), "mx_rule": rule, **extra})


def algorithm_settings(cfg: QuantizeConfig, algorithm: str) -> dict:
    """The algorithm's own settings, Program.settings: the fields named `{algorithm}_{option}`, by option."""
    prefix = f"{algorithm}_"
    return {f.name[len(prefix):]: getattr(cfg, f.name) for f in fields(cfg) if f.name.startswith(prefix)}


def mx_rule(cfg: QuantizeConfig, scheme) -> str:
    """The MX shared-exponent rule the recipe asks for (quantize.mx_rule, else the format's)."""
    rule = cfg.mx_rule or scheme.weights.default_rule
    if rule not in MX_RULES:
        raise RecipeError(f"quantize.mx_rule {rule!r} is not floor or ceil", hint="--set quantize.mx_rule=ceil")
    return rule


def nvfp4_weights(cfg: QuantizeConfig):
    """Program.nvfp4_weights: four over six's quantizer, or None (the scheme's own)."""
    return four_over_six.WEIGHTS if cfg.nvfp4_scales == "four_over_six" else None


def group_job(g: QuantGroup, plan: QuantPlan, model_dtype: torch.dtype) -> Job:
    """One fusion group's job; a mixed-precision group carries its own scheme (Job.scheme)."""
    scheme = plan.scheme_of(g)
    outputs = tuple(o for t in g.members for o in ct_outputs(scheme, t.module, *t.shape, model_dtype))
    return Job(g, None, outputs, scheme=scheme if scheme != plan.scheme else None)


def split_jobs(source: Checkpoint, splits: Mapping[str, tuple[Split, ...]]) -> list[Job]:
    """Copies of one expert's slice of a fused tensor (GPT-OSS biases: tfcompile/families/experts.py)."""
    jobs = []
    for name, parts in sorted(splits.items()):
        info = source.info(name)
        for out, expert, rows in parts:
            n = len(range(*rows)) if rows else info.shape[-1]
            jobs.append(Job(None, name, (OutSpec(out, torch_dtype_of(info.dtype), (n,)),), part=(expert, rows)))
    return jobs


def kv_scale_jobs(calib: CalibStats | None, model_dtype: torch.dtype) -> list[Job]:
    """k_scale / v_scale per attention module: max|K| / 448 (dequant multiplier, as vLLM reads it).
    An NVFP4 KV cache stores the same value (as modelopt exports it for TensorRT-LLM): its global
    dequant multiplier is k_scale / 6 (evaluate/kvcache.py).

    Per tensor: shape (1,); per KV head ("attn_head"): (kv_heads, 1, 1). Stored in the
    model dtype, rounded up like the FP8 input scales; a head no token reached gets 1.0."""
    if calib is None or not calib.kv_strategy:
        return []
    jobs = []
    for attn, pair in sorted(calib.kv_amax.items()):
        for kind, amax in zip(("k_scale", "v_scale"), pair):
            amax = amax.float()
            if calib.kv_strategy == "tensor":
                amax = amax.amax().reshape(1)
            s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
            if calib.kv_strategy == "attn_head":
                s = s.reshape(-1, 1, 1)
            t = round_scale_up(s, model_dtype)
            jobs.append(Job(None, None, (OutSpec(f"{attn}.{kind}", t.dtype, tuple(t.shape)),), const=t))
    return jobs
