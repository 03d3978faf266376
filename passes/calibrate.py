"""`calibrate`: activation statistics for schemes with static input scales."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tfcompile.calibration.observers import OBSERVERS
from tfcompile.calibration.record import CALIB
from tfcompile.calibration.statistics import STATISTICS
from tfcompile.dist import LOCAL
from tfcompile.dist.devices import check_device, resolve_device
from tfcompile.dist.partition import hessian_owners
from tfcompile.families.mtp import is_mtp, mtp_prefixes
from tfcompile.families.names import per_decoder_layer
from tfcompile.errors import RecipeError
from tfcompile.io.resume import source_identity
from tfcompile.ir import LAYER_SOLVERS, CalibStats, LayerSolverSpec, torch_dtype
from tfcompile.machine import COMPUTE_DTYPES, compute_dtype
from tfcompile.pipeline.intents import CalibrationRun, KVCacheScales, LayerSolve, RunsTheModel
from tfcompile.pipeline.passes import PassResult, Selection, recipe_intent, register_pass
from tfcompile.schemes import KV_FORMATS, Scheme


# upper bounds on the calibration set (docs/cli.md "Safety"): far above any useful one (GPTQ and AWQ
# papers use 128 x 2048 tokens), far below what would exhaust memory before the first layer ran
MAX_SAMPLES, MAX_SEQ_LEN, MAX_TOKENS = 1 << 20, 1 << 20, 1 << 28
HESSIAN_DTYPES = ("float32", "compute")


@dataclass(frozen=True)
class CalibrateConfig:
    # file / saved data set / cached data set name / "python-doc" / "stdlib-docstrings" / "self" /
    # "random" / "auto" (python-doc, else stdlib-docstrings, when the tokenizer encodes it, else self:
    # calibration/datasets.py)
    data: str = "auto"
    samples: int = 16  # sequences
    seq_len: int = 128  # tokens per sequence
    seed: int = 0
    # "" (keep the engine's default KV dtype) | "fp8" | "nvfp4": calibrate k_scale/v_scale (amax / 448)
    kv_cache: str = ""
    kv_per_head: bool = False  # one KV scale per KV head instead of per tensor
    # The registered statistics to record (calibration/statistics.py), asked for by the scheduled
    # algorithm (`register_algorithm(calibrate={"statistics": (...)})`: quantize's `implies`). A
    # statistic's options are the fields named `{statistic}_{option}`. `hessian` and `awq` are the
    # switches of the two statistics older recipes name (recorded as they were).
    statistics: tuple[str, ...] = field(default=(), metadata={"omit_default": True})
    hessian: bool = False  # record the "hessian" statistic (calibration/hessian.py; quantize.algorithm=gptq)
    # its option `dtype`: what X^T X is computed and summed in: "float32" (default) | "compute" (the
    # forwards' dtype, calibrate.dtype's choice: bf16 where the CPU has it; docs/accuracy.md "Defaults
    # across models"); recorded only when set, so artifacts made before the option keep their bytes
    hessian_dtype: str = field(default="float32", metadata={"omit_default": True})
    # its option `blocks`: 0, the whole H [K, K]; b > 0, only its diagonal b x b blocks [K / b, b, b] (a
    # scale search's statistic, implied by quantize.scale_search=output when no algorithm needs the whole H)
    hessian_blocks: int = field(default=0, metadata={"omit_default": True})
    # GPTQ and RTN: solve each layer in the layer loop and calibrate the next on its quantized outputs
    # (weights, and inputs where the scheme quantizes them: calibration/propagate.py); false (the
    # default): every statistic from one pass of the unquantized model (on SmolLM2 propagation's
    # gain is inside the spread over calibration draws: docs/accuracy.md "Defaults across models")
    propagate: bool = False
    awq: bool = False  # record the "awq" statistic (calibration/awq_stats.py; quantize.algorithm=awq)
    # "auto": layer by layer from the mapped checkpoint when its tensors map onto the model's
    # parameters, else the whole model; "sequential" insists; "whole" loads the whole model
    mode: str = "auto"
    batch: int = 4  # sequences per layer call in the layer-by-layer loop
    # static activation amax per module (calibration/observers.py): "max" | "percentile" | "mse"
    observer: str = "max"
    percentile: float = 99.99  # observer "percentile": p-th percentile of |x|, in (0, 100]
    # MoE (calibration/moe.py): every token through every expert for the statistics (--calib-all-experts);
    # experts routed fewer tokens take the layer's max over experts and GPTQ's RTN (moe_policy.py)
    all_experts: bool = False
    moe_min_tokens: int = 16
    # where layers, activations, observers and Hessians live (--device; tfcompile/dist/devices.py);
    # not recorded: the statistics are the same up to fp32 rounding on any device
    device: str = field(default="auto", metadata={"runtime": True})
    # what the forwards compute in (tfcompile/machine.py compute_dtype): "auto" (the checkpoint's dtype,
    # but float32 where the CPU emulates bf16) | "float32" | "bfloat16"; the manifest records the result
    dtype: str = "auto"
    # --calib-strict: `auto` fails instead of falling back from python-doc (release pipelines: the same
    # command must not give other weights on a runner that lacks the text); not recorded (no effect on bytes)
    strict: bool = field(default=False, metadata={"runtime": True})
    # --resume-dir: the layer solver's answer for each decoder layer is kept there, so a killed run
    # (learned rounding; GPTQ with propagate) resumes at the first unsolved layer and writes the same
    # bytes (calibration/layer_resume.py); "" keeps nothing. Not recorded (no effect on bytes)
    resume_dir: str = field(default="", metadata={"runtime": True})

    def __post_init__(self) -> None:  # checked when the recipe is built, before anything runs
        check_device(self.device, "calibrate.device")
        if self.dtype not in COMPUTE_DTYPES:
            raise RecipeError(f"calibrate.dtype {self.dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}",
                              hint="--set calibrate.dtype=auto (default: float32 where the CPU emulates bf16)")
        if self.hessian_blocks < 0:
            raise RecipeError(f"calibrate.hessian_blocks {self.hessian_blocks} is negative",
                              hint="0 (the whole Hessian, default) or the format's block size (16 NVFP4, 32 MXFP4)")
        if self.hessian_dtype not in HESSIAN_DTYPES:
            raise RecipeError(f"calibrate.hessian_dtype {self.hessian_dtype!r} is not one of "
                              f"{', '.join(HESSIAN_DTYPES)}",
                              hint="--set calibrate.hessian_dtype=float32 (default) or compute (the forwards' dtype)")
        if self.observer not in OBSERVERS:
            raise RecipeError(f"calibrate.observer {self.observer!r} is unknown",
                              hint="--observer " + "|".join(sorted(OBSERVERS)) + " (default max)")
        if self.kv_cache and self.kv_cache not in KV_FORMATS:
            raise RecipeError(f"calibrate.kv_cache {self.kv_cache!r} is not supported",
                              hint="use --kv-cache fp8 (FP8 E4M3) or nvfp4 (NVFP4, blocks of 16), with calibrated "
                                   "scales")
        if self.kv_cache and self.kv_per_head and not KV_FORMATS[self.kv_cache].per_head:
            raise RecipeError(f"--kv-per-head is not supported with --kv-cache {self.kv_cache} (one global scale "
                              "per tensor; its E4M3 block scales already follow every 16 channels)",
                              hint="drop --kv-per-head")
        if not 0 < self.percentile <= 100:
            raise RecipeError(f"calibrate.percentile {self.percentile!r} is not in (0, 100]",
                              hint="e.g. --set calibrate.percentile=99.99 (100 is the max)")
        for name, option in (("samples", "--calib-samples"), ("seq_len", "--calib-seq-len"), ("batch", None)):
            if getattr(self, name) < 1:
                raise RecipeError(f"calibrate.{name} = {getattr(self, name)} must be at least 1"
                                  + (f" ({option})" if option else ""), hint="calibration needs some tokens")
        tokens = self.samples * self.seq_len
        for name, value, limit in (("samples", self.samples, MAX_SAMPLES), ("seq_len", self.seq_len, MAX_SEQ_LEN),
                                   ("batch", self.batch, MAX_SAMPLES), ("samples x seq_len", tokens, MAX_TOKENS)):
            if value > limit:  # refused here, before a tensor of that many tokens is allocated
                raise RecipeError(f"calibrate.{name} = {value} is above the limit of {limit} (--calib-samples "
                                  f"{self.samples}, --calib-seq-len {self.seq_len})",
                                  hint="calibration saturates long before that: e.g. --calib-samples 128 "
                                       "--calib-seq-len 2048")
        if self.moe_min_tokens < 0:
            raise RecipeError(f"calibrate.moe_min_tokens {self.moe_min_tokens} is negative",
                              hint="e.g. --set calibrate.moe_min_tokens=16 (0: every expert keeps its own)")


def _when(sel: Selection) -> bool:
    """Static activation scales, a calibrated KV cache (--kv-cache), and what other passes ask
    for (GPTQ's Hessians, AWQ's statistics: their `implies`) need statistics."""
    return bool((sel.scheme is not None and sel.scheme.act_static) or sel.value("calibrate", "kv_cache"))


def _unscheduled(scheme: Scheme) -> tuple[str, str]:
    """Why a format's pipeline has no calibrate pass, for calibration options given anyway."""
    why = ("its activations stay in bf16 (weight-only)" if scheme.act is None else
           "its activation scales are computed at run time (dynamic)" if not scheme.act_static else
           "this pipeline leaves the calibrate pass out")
    return (f"needs no calibration data: {why}, and nothing else in this run calibrates",
            "drop the --calib* options; they apply to nvfp4 / fp8 (static activation scales), --kv-cache fp8, "
            "--algorithm gptq / awq / signround and --set quantize.scale_search=output")


@register_pass("calibrate", config=CalibrateConfig, requires=("source", "model", "plan"),
               produces=(CALIB,), when=_when, unscheduled=_unscheduled,
               intents=lambda c: (RunsTheModel("calibrate"),
                                  CalibrationRun(c.samples, c.seq_len, c.batch, c.propagate, c.hessian,
                                                 c.hessian_blocks),
                                  *((KVCacheScales(c.kv_cache, bool(c.kv_per_head)),) if c.kv_cache else ())))
def calibrate(ctx, cfg: CalibrateConfig, reporter) -> PassResult:
    """Observe |x| at every quantized Linear's input (calibrate.observer; calibrate.data, default auto).
    The model is read from ctx.source's directory: the source, or what `rotate` made of it."""
    # lazy: the calibration loops load when the pass runs (docs/design.md "Pass modules")
    from tfcompile.calibration.forward import observe_input_amax
    from tfcompile.calibration.moe_policy import summarize
    if cfg.mode not in MODES:
        raise RecipeError(f"calibrate.mode {cfg.mode!r} is not one of {', '.join(MODES)}",
                          hint="auto (default) calibrates layer by layer when it can")
    _check_seq_len(cfg.seq_len, ctx.source.config)
    modules = {t.module for t in ctx.plan.targets()}
    if cfg.data == "self" and getattr(ctx.source, "source_format", None):
        raise RecipeError(f"calibrating a {ctx.source.source_format['format']} checkpoint with --calib self would "
                          f"hold the whole decoded bf16 model in memory to sample from it",
                          hint="give calibration text (--calib FILE or python-doc), or --calib random")
    data, fallback = _resolve_auto(ctx, cfg, reporter) if cfg.data == "auto" else (cfg.data, "")
    world = ctx.world or LOCAL
    device = resolve_device(cfg.device, world)
    dtype, why = compute_dtype(cfg.dtype, ctx.model.dtype, device.type)
    if world.distributed:  # nodes with other CPUs: every rank computes in rank 0's choice (one artifact)
        dtype, why = world.all_objects("calibrate/dtype", (dtype, why))[0]
    common = dict(data=data, samples=cfg.samples, seq_len=cfg.seq_len, seed=cfg.seed,
                  dtype=getattr(torch, dtype), kv=bool(cfg.kv_cache), **_statistics(ctx, cfg, world))
    common.update(observer=cfg.observer, observer_params=observer_params(cfg, ctx.plan.scheme),
                  all_experts=cfg.all_experts, moe_min_tokens=cfg.moe_min_tokens, progress=reporter,
                  world=world, device=device)
    mtp = _mtp_calibration(ctx, modules, common)  # the MTP layers, on the target's final states
    if mtp is not None:
        modules, common["on_final"] = modules - mtp.modules, mtp
    whole = [n for n in common["statistics"] if STATISTICS[n].whole_model]
    if whole:  # e.g. AWQ's fold check runs the whole model (calibration/awq_stats.py)
        if cfg.mode == "sequential":
            raise RecipeError(f"calibrate.{whole[0]} needs the whole-model loop, not calibrate.mode sequential",
                              hint="use --set calibrate.mode=auto (or whole) with this --algorithm")
        stats, loop = observe_input_amax(Path(ctx.source.path), modules, **common), "whole"
        extra = {}
    else:
        stats, loop, extra = _observe(ctx, cfg, modules, reporter, common)
    if propagating(ctx, cfg) and loop != "sequential":
        reporter.warn("calibrate: error propagation needs the layer-by-layer loop; the statistics come "
                      "from the unquantized model (calibrate.propagate has no effect)")
    if mtp is not None and mtp.stats is not None:
        from tfcompile.calibration.recorders import merge_stats  # lazy: the calibration loops
        stats = merge_stats(stats, mtp.stats)
    stats = dataclasses.replace(stats, data_fallback=fallback, compute_dtype=dtype)
    if cfg.kv_cache:
        stats = dataclasses.replace(stats, kv_strategy="attn_head" if cfg.kv_per_head else "tensor",
                                    kv_format=cfg.kv_cache)
    if stats.fallback:  # one warning listing them (calibration/moe_policy.py: the policy)
        reporter.warn(f"calibrate: {len(stats.fallback)} module(s) saw no token, or are experts routed fewer "
                      f"than {cfg.moe_min_tokens} tokens; they took the fallback amax (their layer's max): "
                      + summarize(list(stats.fallback)))
    return PassResult(ctx.add(CALIB, stats), {"tokens": stats.tokens, "source": stats.source, "loop": loop,
                                               "fallback_modules": list(stats.fallback),
                                               "kv_attention_modules": len(stats.kv_amax),
                                               "solved_in_loop": len(stats.solved),  # by the layer solver
                                               **({"mtp_modules": len(mtp.modules)} if mtp is not None else {}),
                                               **_summaries(stats),
                                               "compute_dtype": dtype, "compute_dtype_why": why,
                                               **extra, **_timings(stats)})


MODES = ("auto", "sequential", "whole")


def _resolve_auto(ctx, cfg: CalibrateConfig, reporter) -> tuple[str, str]:
    """(the source `--calib auto` stands for here, the fallback warning or ""): the first text
    source the tokenizer encodes (calibration.datasets.auto_source), else self; for a decoded
    published checkpoint the first installed text, never self (it would sample the decoded model).
    Passing over the first text source is a warning (stderr, --json, manifest, report), or with
    calibrate.strict (--calib-strict) an error before anything runs."""
    # lazy: the tokenizer and the text sources load when the pass runs (docs/design.md "Pass modules")
    from tfcompile.calibration.datasets import (FALLBACK_HINT, TEXT_SOURCES, auto_source, fallback_message,
                                                installed_text_source)
    from tfcompile.calibration.forward import load_tokenizer  # lazy: transformers' tokenizer
    if getattr(ctx.source, "source_format", None):
        data = installed_text_source()
        refused = () if data == TEXT_SOURCES[0] else (f"{TEXT_SOURCES[0]}: not installed",)
    else:
        config = ctx.source.config
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        vocab = text.get("vocab_size") if isinstance(text.get("vocab_size"), int) else None
        data, refused = auto_source(load_tokenizer(Path(ctx.source.path)), vocab, cfg.samples * cfg.seq_len)
    if not refused:
        return data, ""
    message = fallback_message(data, refused)
    if cfg.strict:
        raise RecipeError(message.replace("fell back to", "would fall back to") + " (--calib-strict)",
                          hint=FALLBACK_HINT)
    reporter.warn(message)
    return data, message


def observer_params(cfg: CalibrateConfig, scheme: Scheme) -> dict:
    """make_observer(cfg.observer, **params): the percentile, or the mse observer's error model."""
    acts = scheme.acts
    clip = acts.clip if acts is not None and acts.static else None
    if cfg.observer != "max" and clip is None:
        raise RecipeError(f"calibrate.observer {cfg.observer!r} has no effect with --format {scheme.name}: "
                          "it has no static activation scales",
                          hint="drop --observer, or use --format nvfp4 or fp8")
    if cfg.observer == "percentile":
        return {"p": cfg.percentile}
    if cfg.observer == "mse":
        return {"model": clip}
    return {}


def _check_seq_len(seq_len: int, config: dict) -> None:
    """Sequences longer than the model's positions would run on for minutes, then mean nothing."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    max_pos = text.get("max_position_embeddings") or text.get("n_positions")
    if isinstance(max_pos, int) and seq_len > max_pos:
        raise RecipeError(f"--calib-seq-len {seq_len} (calibrate.seq_len) exceeds the model's "
                          f"max_position_embeddings {max_pos}", hint=f"pass --calib-seq-len {max_pos} or less")


def _observe(ctx, cfg: CalibrateConfig, modules: set[str], reporter, common: dict):
    """(stats, "sequential" | "whole", extra pass statistics): the layer loop when it applies, else
    the whole model."""
    # lazy: the calibration loops load when the pass runs (docs/design.md "Pass modules")
    from tfcompile.calibration.forward import observe_input_amax
    from tfcompile.calibration.sequential import Unsupported, observe_sequential
    if cfg.mode != "whole":
        layer_times: list[float] = []

        def on_layer(i: int, n: int, seconds: float) -> None:
            layer_times.append(round(seconds, 4))

        try:
            solver = _solver(ctx, cfg)
            resume = _resume(ctx, cfg) if solver is not None else None
            stats = observe_sequential(Path(ctx.source.path), ctx.source, modules, batch=cfg.batch,
                                       on_layer=on_layer, solver=solver, resume=resume, **common)
            extra = {} if resume is None else {"resumed_layers": len(resume.resumed)}
            if getattr(solver, "losses", None):  # learned rounding: block output MSE per layer, start and kept
                extra["signround_block_loss"] = {k: [round(v["loss_start"], 8), round(v["loss"], 8)]
                                                 for k, v in solver.losses.items()}
            return dataclasses.replace(stats, layer_seconds=tuple(layer_times)), "sequential", extra
        except Unsupported as e:
            if cfg.mode == "sequential":
                raise RecipeError(f"calibrate.mode sequential: {e}",
                                  hint="use --set calibrate.mode=whole (the model must fit in RAM)") from None
            reporter.warn(f"calibrate: layer-by-layer loop not possible ({e}); running the whole model")
    return observe_input_amax(Path(ctx.source.path), modules, **common), "whole", {}


def _mtp_calibration(ctx, modules: set[str], common: dict):
    """The loops' `on_final` callback that calibrates the MTP layers config.json declares on the
    target's final hidden states, with the loop's observer and statistics (not the whole-model
    ones), or None when no quantized module is in an MTP layer (tfcompile/draft/mtp_calibrate.py)."""
    prefixes = mtp_prefixes(ctx.source.config)
    mine = {m for m in modules if is_mtp(m, prefixes)}
    if not mine:
        return None
    from tfcompile.draft.mtp_calibrate import MTPCalibration  # lazy: MTP models only
    kwargs = {k: common[k] for k in ("observer", "observer_params", "groups", "all_experts", "moe_min_tokens",
                                     "world", "owner") if k in common}
    kwargs["statistics"] = {n: o for n, o in common["statistics"].items() if not STATISTICS[n].whole_model}
    return MTPCalibration(Path(ctx.source.path), ctx.source, mine, common["dtype"], common["device"], **kwargs)


def _layer_solver(ctx) -> LayerSolverSpec | None:
    """The weight algorithm's layer-loop solver (tfcompile/ir.py LAYER_SOLVERS), if one is scheduled."""
    solve = recipe_intent(ctx.recipe, LayerSolve)
    return LAYER_SOLVERS.get(solve.algorithm) if solve is not None else None


def propagating(ctx, cfg: CalibrateConfig) -> bool:
    """calibrate.propagate asks for the error to be propagated, and quantize's algorithm solves in
    the layer loop when propagating (GPTQ with its Hessians; RTN, whose solve needs no statistic,
    so that the static input scales are observed through the quantized layers)."""
    spec = _layer_solver(ctx)
    return cfg.propagate and spec is not None and spec.loop == "propagate"


def _solver(ctx, cfg: CalibrateConfig):
    """The layer loop's solver (the algorithm's settings and device, LayerSolve), as it registered it:
    GPTQ's when propagating, learned rounding's always; else None."""
    spec = _layer_solver(ctx)
    if spec is None or not (spec.loop == "always" or propagating(ctx, cfg)):
        return None
    solve = recipe_intent(ctx.recipe, LayerSolve)
    return spec.cls(ctx.plan, solve.settings, ctx.source, torch_dtype(ctx.model.dtype),
                    resolve_device(solve.device, ctx.world or LOCAL))


def _resume(ctx, cfg: CalibrateConfig):
    """calibrate.resume_dir's saved layers (claimed for this run: recipe, source, torch, threads,
    processes and device kind must match the run that wrote them), or None."""
    if not cfg.resume_dir:
        return None
    from tfcompile.calibration.layer_resume import LayerCheckpoints  # lazy: the calibration loops
    world = ctx.world or LOCAL
    fingerprint = {"recipe": ctx.recipe.to_dict(), **source_identity(ctx.source), "processes": world.size,
                   "device": resolve_device(cfg.device, world).type}  # a CUDA solve is not the CPU's
    return LayerCheckpoints(cfg.resume_dir, fingerprint, world.rank)


def _timings(stats: CalibStats) -> dict:
    """Wall seconds per decoder layer (layer loop) and spent on each statistic per layer (not in the
    manifest)."""
    out = {}
    if stats.layer_seconds:
        out["layer_seconds"] = list(stats.layer_seconds)
    for name, seconds in sorted(stats.seconds.items()):
        out[f"{name}_seconds_per_layer"] = per_decoder_layer(dict(seconds))
    return out


def _summaries(stats: CalibStats) -> dict:
    """Each recorded statistic's own figures for the pass statistics (e.g. how many groups it covers)."""
    out = {}
    for name in sorted(stats.statistics):
        summary = STATISTICS[name].summary
        out.update(summary(stats) if summary is not None else {})
    return out


def requested(cfg: CalibrateConfig) -> list[str]:
    """The statistics the recipe asks for: `statistics`, and the statistics whose switch is on (a
    boolean field of the statistic's name); each must be registered (calibration/statistics.py)."""
    names = set(cfg.statistics) | {f.name for f in dataclasses.fields(cfg)
                                   if f.name in STATISTICS and getattr(cfg, f.name) is True}
    unknown = sorted(names - set(STATISTICS))
    if unknown:
        raise RecipeError(f"calibrate.statistics: {unknown[0]!r} is not a registered statistic",
                          hint="registered: " + ", ".join(sorted(STATISTICS)))
    return sorted(names)


def _statistics(ctx, cfg: CalibrateConfig, world) -> dict:
    """The loops' statistics (name -> its options: the `{name}_{option}` fields), the fusion groups they
    are recorded for, and under torchrun the rank that folds each group's (the rank that then
    computes with it in pack, as tfcompile/dist/partition.py assigns solves)."""
    names = requested(cfg)
    fields = [f.name for f in dataclasses.fields(cfg)]
    statistics = {n: {f[len(n) + 1:]: getattr(cfg, f) for f in fields if f.startswith(n + "_")} for n in names}
    out = {"statistics": statistics,
           "groups": {t.module: g.key for g in ctx.plan.groups for t in g.members} if names else None}
    if names and world.distributed:
        solve = recipe_intent(ctx.recipe, LayerSolve)
        out["owner"] = hessian_owners(ctx.plan.groups, world.size, solve.expert_batch if solve is not None else 8)
    return out
