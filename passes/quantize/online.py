"""`quantize.online_hadamard=B`: which runs an online block-Hadamard transform can serve, and which not.

The transform itself (W R at quantize, R^T H R for GPTQ, the transform_config, the emulation) is
tfcompile/rotate/online.py; rtn.py and gptq.py apply it to each group (`Program.online_hadamard`),
pack writes the config. What cannot work is refused before anything runs (the recipe) or when the
plan is known (the model), each with the option's name and a hint:

- B not a power of two (hadacore and compressed-tensors' deterministic Hadamard are Sylvester's);
- a format without block scales, or with static activation scales (calibrated on the
  untransformed inputs). B need not divide the scale block: an order that divides it mixes only
  values that share a scale (MXFP4's 32: MR-GPTQ's choice), a larger one mixes several blocks,
  which no engine minds (vLLM's hadacore runs per `head_dim` block, whatever the quantization) and
  which SmolLM2's NVFP4 study found better (order 64 over 16: docs/accuracy.md);
- an algorithm other than rtn / gptq, an output scale search, the layer loop's solves
  (calibrate.propagate), distillation, mixed precision, engine layouts and other single-scheme
  views (Triton/CUTLASS kernels, ONNX, the modelopt view): none of them applies the transform;
- fused MoE experts (vLLM's transforms wrap Linear layers only) and a K not divisible by B.
"""

from __future__ import annotations

from tfcompile.errors import RecipeError
from tfcompile.families.experts import is_expert_group
from tfcompile.ir import Program, QuantPlan
from tfcompile.pipeline.intents import CalibrationRun, ExtraViews, SingleScheme
from tfcompile.pipeline.passes import Unsupported, recipe_intents
from tfcompile.recipe import Recipe
from tfcompile.rotate.online import valid_order
from tfcompile.schemes import Scheme

ALGORITHMS = ("rtn", "gptq")  # the algorithms that quantize W R with R^T H R (rtn.py, gptq.py)
OFF = "drop --set quantize.online_hadamard"


def online_unsupported(recipe: Recipe, cfg, scheme: Scheme | None) -> list[Unsupported]:
    """Every reason the recipe cannot carry quantize.online_hadamard=cfg.online_hadamard."""
    b = cfg.online_hadamard
    if not b:
        return []
    name = f"quantize.online_hadamard={b}"
    if not valid_order(b):
        return [Unsupported(f"{name}: the order must be a power of two (a Sylvester Hadamard matrix, as vLLM's "
                            "hadacore kernel and compressed-tensors build it)",
                            "use --set quantize.online_hadamard=32 (MXFP4's block)")]
    out = []
    if scheme is not None and not scheme.weights.block_scaled:
        out.append(Unsupported(f"{name}: {scheme.name}'s weights have no block scales",
                               "use a block format: mxfp4 or mxfp4a16 (order 32), nvfp4a16 (order 64)"))
    if scheme is not None and scheme.act_static:
        out.append(Unsupported(f"{name}: {scheme.name} stores static activation scales, calibrated on the "
                               "untransformed inputs", "use a format with dynamic or no activation "
                                                       "quantization (mxfp4, mxfp4a16, nvfp4a16)"))
    if cfg.algorithm not in ALGORITHMS:
        out.append(Unsupported(f"{name}: algorithm {cfg.algorithm} does not quantize under the transform",
                               f"use --algorithm rtn or gptq, or {OFF}"))
    if cfg.scale_search != "none":
        out.append(Unsupported(f"{name}: quantize.scale_search={cfg.scale_search} scores untransformed weights",
                               f"drop quantize.scale_search, or {OFF}"))
    if any(c.propagate for c in recipe_intents(recipe, CalibrationRun)):
        out.append(Unsupported(f"{name}: calibrate.propagate solves the untransformed weights in the layer loop",
                               f"drop calibrate.propagate, or {OFF}"))
    by = sorted({i.by for i in recipe_intents(recipe, SingleScheme)})
    if by:
        out.append(Unsupported(f"{name}: {', '.join(by)} would use the stored W R without the online x R "
                               "(only the compressed-tensors view and vLLM apply it)", f"drop the options that schedule {', '.join(by)}, or {OFF}"))
    views = [v for i in recipe_intents(recipe, ExtraViews) for v in i.views]
    if views:
        out.append(Unsupported(f"{name}: the {', '.join(views)} view cannot carry the online transform "
                               "(TensorRT-LLM and the modelopt format have none)", f"drop --export, or {OFF}"))
    return out


def check_online(plan: QuantPlan, program: Program) -> None:
    """What the plan reveals: mixed precision, fused MoE experts, a K the order does not divide, solved groups."""
    b = program.online_hadamard
    if not b:
        return
    name = f"quantize.online_hadamard={b}"
    if plan.group_schemes:
        raise RecipeError(f"{name}: mixed precision writes several config groups; the transform is checked for "
                          "one scheme", hint=f"drop the mixed.* settings, or {OFF}")
    experts = [g.key for g in plan.groups if is_expert_group(g.key)]
    if experts:
        raise RecipeError(f"{name}: {experts[0]} holds fused MoE experts, and vLLM applies online transforms to "
                          "Linear layers only (compressed_tensors/transform/linear.py)",
                          hint=f"--ignore the experts, or {OFF}")
    bad = [t for t in plan.targets() if t.shape[1] % b]
    if bad:
        raise RecipeError(f"{name}: {bad[0].module} has K = {bad[0].shape[1]}, not a multiple of {b}",
                          hint=f"--ignore {bad[0].module}, or {OFF}")
    if program.solved:
        raise RecipeError(f"{name}: the layer loop solved untransformed weights", hint=f"{OFF}")
