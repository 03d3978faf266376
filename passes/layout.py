"""`layout`: arrange attention weights and the KV cache the way the target engine reads them.

Scheduled by `--layout ENGINE`, `--tp T`, `--kv-layout`, `--kv-block-size` or any
`layout.*` setting, right after `select` (before calibration, so a bad
combination fails in a second, not after an hour). It quantizes nothing: it
validates the options against the target's rules (tfcompile/layout/engines.py),
plans the row gathers (RoPE order, TP head order, KV replication) and fusions
(q/k/v -> qkv_proj, gate/up -> gate_up_proj, expert w1/w3), and produces the
layout plan (the fact `LAYOUT`, tfcompile/layout/artifact_files.py). pack then writes the
engine view OUT/<target>/ (quantizing the gathered rows) and OUT/tfcompile/kv_cache.json; manifest
records what was done. Defaults per target: vLLM and SGLang fuse on load and
read HF RoPE order, so `--layout vllm` writes only the descriptor; TensorRT-LLM
gets a fused view.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tfcompile.errors import RecipeError
from tfcompile.families.attention import SOURCE_ROPE
from tfcompile.ir import QuantPlan
from tfcompile.layout import engines as E
from tfcompile.layout.artifact_files import LAYOUT
from tfcompile.layout.heads import HeadGeometry, plan_heads, rope_order
from tfcompile.layout.plan import LayoutPlan, LayoutSpec, build
from tfcompile.pipeline.intents import KVCacheScales, SharedGlobalScales, SingleScheme
from tfcompile.pipeline.passes import PassResult, Unsupported, check, given, recipe_intent, register_pass
from tfcompile.recipe import Recipe
from tfcompile.schemes import KV_BY_DTYPE, KV_FORMATS, kv_block

KV_AUTO = "auto"


@dataclass(frozen=True)
class LayoutConfig:
    target: str = "vllm"  # --layout: vllm | sglang | trtllm
    backend: str = ""  # attention backend ("" = the engine's default: flash-attn, flashinfer, trtllm)
    fuse_qkv: bool | None = None  # None = the target's default (trtllm: fused; vllm/sglang: not)
    fuse_gate_up: bool | None = None  # gate/up and MoE w1/w3
    rope: str = ""  # "" = the checkpoint's convention | "half" | "interleaved"
    tp: int = 1  # --tp: tensor-parallel shards the heads are grouped for
    kv_layout: str = ""  # --kv-layout NHD | HND ("" = the backend's own)
    block_size: int = 0  # --kv-block-size: tokens per KV page (0 = the backend's default)
    head_dim_pad: int = 0  # KV-cache head dim (0 = the smallest the backend accepts >= head_dim)
    kv_dtype: str = KV_AUTO  # auto (from --kv-cache) | bf16 | fp16 | fp8_e4m3 | nvfp4


def _kv(recipe: Recipe) -> tuple[str, bool]:
    """(the KV format whose scales the recipe calibrates, "" for none; one scale per KV head)."""
    kv = recipe_intent(recipe, KVCacheScales, KVCacheScales("", False))
    return kv.kind, kv.per_head


def kv_dtype(requested: str, calibrated: str, model_dtype: str | None) -> str:
    """The KV-cache dtype: `auto` follows --kv-cache; an explicit one must agree with it."""
    model = "fp16" if model_dtype == "F16" else "bf16"
    if requested == KV_AUTO:
        return KV_FORMATS[calibrated].dtype if calibrated in KV_FORMATS else model
    if requested not in E.KV_DTYPES:
        raise RecipeError(f"layout.kv_dtype {requested!r} is not one of auto, {', '.join(E.KV_DTYPES)}",
                          hint="--set layout.kv_dtype=auto follows --kv-cache")
    if requested in KV_BY_DTYPE and calibrated not in KV_FORMATS:
        raise RecipeError(f"layout.kv_dtype {requested} needs calibrated KV scales",
                          hint=f"add --kv-cache {KV_BY_DTYPE[requested].name} (it calibrates k_scale/v_scale)")
    if requested in ("bf16", "fp16") and calibrated:
        raise RecipeError(f"layout.kv_dtype {requested} contradicts --kv-cache {calibrated}: the artifact's "
                          f"kv_cache_scheme makes engines quantize the cache",
                          hint="drop --kv-cache, or use --set layout.kv_dtype=auto")
    return requested


def _static_checks(recipe: Recipe, cfg: LayoutConfig) -> tuple[E.BackendRules, list[str]]:
    r = E.rules_for(cfg.target, cfg.backend)
    if cfg.tp < 1:
        raise RecipeError(f"--tp {cfg.tp}: must be at least 1", hint="e.g. --tp 2")
    E.check_layout(r, cfg.kv_layout or r.kv_layouts[0])
    E.check_block(r, cfg.block_size or r.default_block)
    calibrated, per_head = _kv(recipe)
    warnings = E.check_kv(r, kv_dtype(cfg.kv_dtype, calibrated, None), per_head)
    if cfg.rope:
        rope_order(HeadGeometry(1, 1, 2, 2), "half", cfg.rope)  # validates the name
        E.check_rope(r, cfg.rope)
    fuse = any(r.fuse if f is None else f for f in (cfg.fuse_qkv, cfg.fuse_gate_up))
    if fuse and not recipe_intent(recipe, SharedGlobalScales, SharedGlobalScales(True)).shared:
        raise RecipeError("a fused view needs select.fuse_groups=true (members share one NVFP4 global scale)",
                          hint="drop --set select.fuse_groups=false, or --set layout.fuse_qkv=false "
                               "--set layout.fuse_gate_up=false")
    return r, warnings


def _supports(recipe: Recipe, cfg: LayoutConfig) -> list[Unsupported]:
    return check(_static_checks, recipe, cfg)


@register_pass("layout", config=LayoutConfig, requires=("source", "model", "plan"), produces=(LAYOUT,),
               supports=_supports, when=given("layout"), intents=lambda c: (SingleScheme("layout"),))
def layout(ctx, cfg: LayoutConfig, reporter) -> PassResult:
    """Validate the target layout and plan fusions, RoPE order and TP head grouping."""
    rules, warnings = _static_checks(ctx.recipe, cfg)
    geom = HeadGeometry.from_config(ctx.source.config)
    spec = resolve(cfg, rules, ctx, geom, warnings)
    heads = None
    if geom is not None:
        heads = plan_heads(geom, spec.tp, rope_order(geom, spec.rope_src, spec.rope)
                           if spec.rope_src in E.ROPE_KNOWN else None)
    elif spec.tp > 1:
        raise RecipeError("--tp needs attention heads in config.json (num_attention_heads)",
                          hint="drop --tp for this model")
    names = {n: tuple(ctx.source.info(n).shape) for n in ctx.source.names()}
    lp = build(spec, heads, ctx.plan, names)
    _check_blocks(lp, ctx.plan)
    lp = dataclasses.replace(lp, warnings=tuple(warnings))
    if lp.view is not None and ctx.world is not None and ctx.world.distributed:
        raise RecipeError("an engine view that rewrites weights (OUT/<engine>/) is not written by more than "
                          "one process yet", hint="run this --layout without torchrun, or drop --tp / the "
                          "fused-weights engine")
    for w in warnings:
        reporter.warn(w)
    fused = lp.fused()
    stats = {"target": f"{spec.target}/{spec.backend}", "view": lp.view, "fused_linears": len(fused),
             "gathered_linears": sum(len(v) for v in lp.groups.values()) - len(fused),
             "tp": spec.tp, "rope": spec.rope, "kv_dtype": spec.kv_dtype, "kv_layout": spec.kv_layout,
             "block_size": spec.block_size}
    return PassResult(ctx.add(LAYOUT, lp), stats)


def resolve(cfg: LayoutConfig, r: E.BackendRules, ctx, geom: HeadGeometry | None,
            warnings: list[str]) -> LayoutSpec:
    """Every default filled in from the target's rules and the model."""
    calibrated, per_head = _kv(ctx.recipe)
    src = SOURCE_ROPE.get(ctx.model.model_type, "unknown") if geom is not None else "none"
    rope = cfg.rope or src
    if cfg.rope and cfg.rope != src:
        if src not in E.ROPE_KNOWN:
            raise RecipeError(f"the RoPE convention of model_type {ctx.model.model_type!r} is not known "
                              f"to tfcompile, so it cannot be converted to {cfg.rope}",
                              hint="drop --set layout.rope (the view keeps the checkpoint's order)")
    if src in E.ROPE_KNOWN:
        E.check_rope(r, rope)
    dtype = kv_dtype(cfg.kv_dtype, calibrated, ctx.model.dtype)
    quantized = dtype in KV_BY_DTYPE
    engine_scale = ("per tensor" if not (per_head and quantized) else
                    {"yes": "per head", "collapse": "max over heads"}[r.per_head_scales])
    pad = E.padded_head_dim(r, geom.head_dim, cfg.head_dim_pad) if geom is not None else cfg.head_dim_pad
    block = kv_block(dtype)
    if block and geom is not None and geom.head_dim % block:
        raise RecipeError(f"{KV_BY_DTYPE[dtype].modelopt_algo} KV needs head_dim a multiple of {block} (blocks of "
                          f"{block}), not {geom.head_dim}", hint="--set layout.kv_dtype=fp8_e4m3")
    return LayoutSpec(
        target=r.engine, backend=r.backend,
        fuse_qkv=r.fuse if cfg.fuse_qkv is None else cfg.fuse_qkv,
        fuse_gate_up=r.fuse if cfg.fuse_gate_up is None else cfg.fuse_gate_up,
        rope_src=src, rope=rope, tp=cfg.tp, kv_layout=cfg.kv_layout or r.kv_layouts[0],
        block_size=cfg.block_size or r.default_block, head_dim_pad=pad, kv_dtype=dtype,
        kv_per_head=per_head and quantized, engine_scale=engine_scale)


def _check_blocks(lp: LayoutPlan, plan: QuantPlan) -> None:
    """FP8 128x128 blocks: each TP shard of a view Linear must start on a block row."""
    if plan.scheme.granularity != "block":
        return
    bn = plan.scheme.block[0]
    for views in lp.groups.values():
        for v in views:
            starts = [sh[0][1] for sh in v.shards]
            if lp.spec.tp > 1 and any(s % bn for s in starts):
                raise RecipeError(f"{v.module}: TP shards start at rows {starts}, not on the {bn}-row "
                                  f"blocks of {plan.scheme.name}", hint="use another --tp or --format")
