"""`quantize` (RTN): round-to-nearest with max-derived scales.

Builds the lazy `Program` and registers the `rtn` algorithm that pack runs per
group. Storage rules beside the format math (kernels/formats):
- NVFP4 groups (q/k/v, gate/up, expert w1/w3) share one global scale: the
  group's max amax; engines otherwise take the max and lose accuracy.
- FP8 scales are stored in the model dtype (as compressed-tensors does). The
  fp32 scale amax/448 is rounded *up* to that dtype and the weight is
  quantized with the stored value, so stored data and scale agree exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tfcompile.passes.quantize.naming import OutSpec, ct_outputs
from tfcompile.passes.quantize.program import (
    ALGORITHMS, PREPARE, SUPPORTS, Job, Program, load_target, register_algorithm, torch_dtype)
from tfcompile.io.dtypes import torch_dtype_of
from tfcompile.kernels import formats as F
from tfcompile.errors import RecipeError
from tfcompile.pipeline.passes import PassResult, register_pass
from tfcompile.schemes import SCHEMES


NVFP4_SCALE_RULES = ("max", "four_over_six")  # quantize.nvfp4_scales (four_over_six.py)


@dataclass(frozen=True)
class QuantizeConfig:
    algorithm: str = "rtn"  # "rtn" | "mse" (block-scale search, mse.py) | "gptq" (gptq.py) | "awq" (awq.py)
    gptq_act_order: bool = True  # gptq: visit columns by decreasing diag(H)
    gptq_damp: float = 0.01  # gptq: fraction of mean diag(H) added to the diagonal
    gptq_expert_batch: int = 8  # gptq: MoE experts of one shape solved together (memory: that many experts)
    mx_rule: str = ""  # "floor" | "ceil"; empty = the formats module default
    nvfp4_scales: str = "max"  # NVFP4 block scales: "max" (block max -> 6) | "four_over_six" (four_over_six.py)
    sqnr_rows: int = 16  # rows per Linear sampled for the manifest's weight SQNR (0 = all)


def _supports(recipe, cfg: QuantizeConfig) -> str | None:
    """An algorithm that declares its formats (SUPPORTS) rejects the others before anything runs."""
    check = SUPPORTS.get(cfg.algorithm)
    fmt = recipe.config("select").format if "select" in recipe.names() else recipe.format
    if cfg.nvfp4_scales not in NVFP4_SCALE_RULES:
        raise RecipeError(f"quantize.nvfp4_scales {cfg.nvfp4_scales!r} is unknown",
                          hint="choose one of: " + ", ".join(NVFP4_SCALE_RULES))
    if cfg.nvfp4_scales != "max" and fmt in SCHEMES and SCHEMES[fmt].weight != "nvfp4":
        raise RecipeError(f"quantize.nvfp4_scales {cfg.nvfp4_scales} needs an NVFP4 format, not {fmt}",
                          hint="use --format nvfp4 or nvfp4a16, or drop the setting")
    if check is not None and fmt in SCHEMES:
        check(SCHEMES[fmt])  # raises RecipeError with a hint
    return None


@register_pass("quantize", config=QuantizeConfig, requires=("source", "model", "plan"),
               produces=("program",), supports=_supports)
def quantize(ctx, cfg: QuantizeConfig, reporter) -> PassResult:
    """Plan every output tensor (names, dtypes, shapes) for round-to-nearest quantization."""
    plan, model_dtype = ctx.plan, torch_dtype(ctx.model.dtype)
    scheme = plan.scheme
    jobs = [_group_job(g, plan, model_dtype) for g in plan.groups]
    for name in plan.passthrough:
        info = ctx.source.info(name)
        jobs.append(Job(None, name, (_spec(name, info),)))
    jobs += split_jobs(ctx.source, plan.splits or {})
    act = dict(ctx.calib.input_amax) if ctx.calib is not None else {}
    missing = [t.module for g in plan.groups if plan.scheme_of(g).act_static
               for t in g.members if t.module not in act]
    if missing:
        raise RuntimeError(f"{scheme.name} needs calibrated input scales; none for {missing[:3]}")
    rule = cfg.mx_rule or (F.DEFAULT_MXFP8_RULE if scheme.weight == "mxfp8" else F.DEFAULT_MX_RULE)
    if rule not in ("floor", "ceil"):
        raise RecipeError(f"quantize.mx_rule {rule!r} is not floor or ceil", hint="--set quantize.mx_rule=ceil")
    kv_jobs = kv_scale_jobs(ctx.calib, model_dtype)
    kv_strategy = ctx.calib.kv_strategy if kv_jobs else None
    kv_modules = tuple(sorted(ctx.calib.kv_amax)) if kv_jobs else ()
    if cfg.algorithm not in ALGORITHMS:
        raise RecipeError(f"quantize.algorithm {cfg.algorithm!r} is unknown",
                          hint="choose one of: " + ", ".join(sorted(ALGORITHMS)))
    hessians = ctx.calib.hessians if ctx.calib is not None else {}  # lazy: may be spilled to disk
    if cfg.algorithm == "gptq" and not hessians:
        raise RecipeError("quantize.algorithm gptq needs Hessians from the calibrate pass",
                          hint="use --algorithm gptq (it schedules calibrate with hessian=true)")
    program = Program(scheme, cfg.algorithm, tuple(jobs + kv_jobs), act, rule, cfg.sqnr_rows,
                      kv_strategy, kv_modules, hessians, cfg.gptq_act_order, cfg.gptq_damp,
                      gptq_expert_batch=cfg.gptq_expert_batch, nvfp4_scales=cfg.nvfp4_scales,
                      kv_format=ctx.calib.kv_format if kv_jobs else "fp8")
    extra = {}
    if cfg.algorithm in PREPARE:  # plan-time work of the algorithm (AWQ: search and fold)
        program, extra = PREPARE[cfg.algorithm](ctx, program, reporter)
    return PassResult(ctx.with_(program=program),
                      {"jobs": len(jobs), "outputs": len(program.specs()), "mx_rule": rule, **extra})


def _group_job(g, plan, model_dtype) -> Job:
    """One fusion group's job; a mixed-precision group carries its own scheme (Job.scheme)."""
    scheme = plan.scheme_of(g)
    outputs = tuple(o for t in g.members for o in ct_outputs(scheme, t.module, *t.shape, model_dtype))
    return Job(g, None, outputs, scheme=scheme if scheme != plan.scheme else None)


def kv_scale_jobs(calib, model_dtype: torch.dtype) -> list[Job]:
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
            s = torch.where(amax > 0, amax / F.E4M3_MAX, torch.ones_like(amax))
            if calib.kv_strategy == "attn_head":
                s = s.reshape(-1, 1, 1)
            t = _round_up(s, model_dtype)
            jobs.append(Job(None, None, (OutSpec(f"{attn}.{kind}", t.dtype, tuple(t.shape)),), const=t))
    return jobs


def _spec(name, info):
    return OutSpec(name, torch_dtype_of(info.dtype), tuple(info.shape))


def split_jobs(source, splits) -> list[Job]:
    """Copies of one expert's slice of a fused tensor (GPT-OSS biases: tfcompile/families/experts.py)."""
    jobs = []
    for name, parts in sorted(splits.items()):
        info = source.info(name)
        for out, expert, rows in parts:
            n = len(range(*rows)) if rows else info.shape[-1]
            jobs.append(Job(None, name, (OutSpec(out, torch_dtype_of(info.dtype), (n,)),), part=(expert, rows)))
    return jobs


@register_algorithm("rtn")
def run_rtn(job: Job, program: Program, source, quantizer=None, weights=None):
    """Quantize one group; returns its output tensors and per-Linear stats.

    `quantizer(w, scheme, program, gscale, name, model_dtype) -> QTensor` replaces
    round-to-nearest (the `mse` algorithm passes its scale search). `weights` ([N, K] per
    member) replace the source's (AWQ passes W * s, float32); scales stay in the source dtype."""
    quantizer = quantizer or quantize_weight
    scheme, members = program.scheme, job.group.members
    src = [load_target(source, t) for t in members]
    model_dtype = src[0].dtype
    weights = src if weights is None else weights
    gscale = group_global_scale(scheme, members, weights, program.nvfp4_scales)
    out, stats = {}, []
    for t, w in zip(members, weights):
        q = quantizer(w, scheme, program, gscale, t.source, model_dtype)
        out.update(ct_tensors(q, scheme, t.module, program, members, model_dtype))
        stats.append(layer_stats(t, w, q, scheme, program.sqnr_rows))
    return out, stats


def group_global_scale(scheme, members, weights, nvfp4_scales: str = "max") -> torch.Tensor | None:
    """NVFP4: one global scale for the fused group, from its largest |w| ((1,) float32); else None.
    `nvfp4_scales` "four_over_six" normalises to 256 instead of 448 (four_over_six.py)."""
    if scheme.weight != "nvfp4":
        return None
    amax = torch.cat([F.weight_amax(w, name=t.source) for t, w in zip(members, weights)]).amax()
    if nvfp4_scales == "four_over_six":
        from tfcompile.passes.quantize import four_over_six  # imports mse, which imports this module

        return four_over_six.global_scale(amax.reshape(1))
    return F.nvfp4_global_scale(amax.reshape(1))


def quantize_weight(w, scheme, program, gscale, name, model_dtype):
    rule = program.mx_rule
    if scheme.weight == "nvfp4" and program.nvfp4_scales == "four_over_six":
        from tfcompile.passes.quantize import four_over_six

        return four_over_six.quantize(w, gscale, name)
    if scheme.weight == "nvfp4":
        return F.quantize_nvfp4(w, global_scale=gscale, name=name)
    if scheme.weight == "mxfp4":
        return F.quantize_mxfp4(w, rule=rule, name=name)
    if scheme.weight == "mxfp8":
        return F.quantize_mxfp8(w, rule=rule, name=name)
    block = scheme.block or (128, 128)
    stored = _round_up(F.fp8_weight_scale(w, scheme.granularity, block=block, name=name), model_dtype)
    return F.quantize_fp8(w, scheme.granularity, scale=stored.float(), block=block, name=name)


def _round_up(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Smallest `dtype` values >= the fp32 scales (rounding down would clip amax)."""
    s = scale.to(dtype)
    low = s.float() < scale
    return torch.where(low, torch.nextafter(s, torch.full_like(s, float("inf"))), s)


def ct_tensors(q, scheme, module, program, members, model_dtype) -> dict[str, torch.Tensor]:
    m = module
    if scheme.weight in ("nvfp4", "mxfp4"):
        out = {f"{m}.weight_packed": q.data, f"{m}.weight_scale": q.scale}
        if scheme.weight == "nvfp4":
            out[f"{m}.weight_global_scale"] = q.global_scale.reshape(1).float()
            if scheme.act_static:
                amax = torch.tensor([max(program.act_amax[t.module] for t in members)])
                out[f"{m}.input_global_scale"] = F.nvfp4_global_scale(amax.float())
        return out
    out = {f"{m}.weight": q.data, f"{m}.weight_scale": q.scale if scheme.weight == "mxfp8"
           else q.scale.to(model_dtype)}
    if scheme.act_static:  # fp8 static per-tensor input scale amax/448, shared by the fused group
        amax = max(program.act_amax[t.module] for t in members)
        s = torch.tensor([amax / F.E4M3_MAX]).clamp_min(1e-12)
        out[f"{m}.input_scale"] = _round_up(s, model_dtype)
    return out


def layer_stats(t, w, q, scheme, rows: int) -> dict:
    """Weight SQNR (dB) on up to `rows` evenly spaced rows (all rows when rows=0)."""
    n = w.shape[0]
    idx = torch.arange(n) if rows <= 0 or rows >= n else torch.linspace(0, n - 1, rows).round().long()
    ref = w[idx].float()
    deq = dequantize_rows(q, idx, scheme)
    err = (ref - deq).pow(2).sum().item()
    sig = ref.pow(2).sum().item()
    sqnr = float("inf") if err == 0 else 10.0 * torch.log10(torch.tensor(sig / err)).item()
    return {"module": t.module, "format": scheme.name, "shape": list(t.shape),
            "sqnr_db": round(sqnr, 3) if sqnr != float("inf") else None}


def dequantize_rows(q, idx: torch.Tensor, scheme) -> torch.Tensor:
    """Dequantize only rows `idx` of a quantized [N, K] weight (fp32)."""
    data = q.data[idx]
    if q.format == "fp8":
        s = q.scale.float()
        if q.granularity == "tensor":
            return data.float() * s.reshape(())
        if q.granularity == "channel":
            return data.float() * s[idx]
        bn, bk = q.block
        k = data.shape[-1]
        per_row = s[idx // bn].repeat_interleave(bk, dim=1)[:, :k]
        return data.float() * per_row
    sub = dataclasses.replace(q, data=data, scale=q.scale[idx], shape=(len(idx), q.shape[-1]))
    return F.dequantize(sub, torch.float32)
