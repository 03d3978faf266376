"""`mixed`: mixed precision, a format per fusion group chosen under a budget from measured sensitivity.

Scheduled by any `mixed.*` setting, right after `select`:

    tfcompile quantize --format nvfp4a16 MODEL -o OUT --set mixed.avg_bits=5.5
    tfcompile quantize --format nvfp4a16 MODEL -o OUT --set mixed.max_kl=0.05 --set 'mixed.formats=["fp8-dynamic","bf16"]'

`--format` is the base (every group starts there); `mixed.formats` lists the formats a group
may be upgraded to ("bf16": left unquantized). Each group's cost per format is the KL of the
model's output with that group alone quantized (RTN, activations as at inference) on
`samples x seq_len` calibration tokens: estimated from one forward and one backward
(`mixed.sensitivity=fisher`, the default: tfcompile/mixed/fisher.py) or measured with a forward
per group and format (`kl`: tfcompile/mixed/sensitivity.py); tfcompile/mixed/search.py upgrades
groups greedily by KL saved per extra bit until the budget (`avg_bits`: stored bits per weight
over the quantized Linears; or `max_kl`: predicted KL) is met. The plan then carries each
group's scheme: the artifact holds one compressed-tensors config group per format (explicit
module targets), the manifest records the search under "mixed" and each layer's format, and
verify checks config groups against the tensors. Fused groups (q/k/v, gate/up) always share a
format, as engines fuse them.

Not combined with: awq/smoothquant (their search assumes one scheme), distill, --export
modelopt/onnx, --layout, --target (each handles one scheme today).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tfcompile.ir import torch_dtype
from tfcompile.mixed import cache
from tfcompile.mixed import plan as mixed_plan
from tfcompile.mixed.search import UNQUANTIZED, bits, choose, known, summary
from tfcompile.pipeline.intents import ExtraViews, SingleScheme, WeightRounding
from tfcompile.pipeline.passes import PassResult, Unsupported, given, recipe_intent, recipe_intents, register_pass
from tfcompile.recipe import Recipe
from tfcompile.schemes import SCHEMES

MEASURES = ("fisher", "kl")  # mixed.sensitivity: tfcompile/mixed/fisher.py, sensitivity.py (_measure)


@dataclass(frozen=True)
class MixedConfig:
    formats: tuple[str, ...] = ("fp8-dynamic",)  # formats a group may be upgraded to ("bf16": unquantized)
    avg_bits: float = 0.0  # budget: stored bits per weight over the quantized Linears (> 0 to use)
    max_kl: float = 0.0  # or: the predicted KL (nats/token) to reach with the fewest bits (> 0 to use)
    data: str = "auto"  # sensitivity tokens (as calibrate.data)
    samples: int = 2
    seq_len: int = 256
    seed: int = 0
    # how a group's cost is measured: "fisher" (one forward + backward, tfcompile/mixed/fisher.py)
    # or "kl" (the KL with the group alone quantized, a forward per group and format: sensitivity.py)
    sensitivity: str = "fisher"
    # reuse the sensitivities measured for the same model, groups and settings (tfcompile/mixed/cache.py)
    cache: bool = field(default=True, metadata={"runtime": True})


def _supports(recipe: Recipe, cfg: MixedConfig) -> list[Unsupported]:
    reasons = []
    if (cfg.avg_bits > 0) == (cfg.max_kl > 0):
        reasons.append(Unsupported("mixed precision needs one budget: mixed.avg_bits or mixed.max_kl",
                                   "e.g. --set mixed.avg_bits=5.5 (stored bits per weight) or --set mixed.max_kl=0.05"))
    base = recipe.quant_format()
    base_bits = bits(base) if known(base) else 0.0
    bad = [f for f in cfg.formats if not known(f)]
    if bad or not cfg.formats:
        reasons.append(Unsupported(f"mixed.formats {list(cfg.formats)}: unknown format {bad[:1] or '(none given)'}",
                                   "formats: " + ", ".join(list(SCHEMES) + [UNQUANTIZED])))
    low = [f for f in cfg.formats if known(f) and bits(f) <= base_bits]
    if low:
        reasons.append(Unsupported(f"mixed.formats {low}: not more bits than the base --format {base}",
                                   "the base format is the smallest; list the formats groups may be upgraded to"))
    if cfg.avg_bits and cfg.avg_bits < base_bits:
        reasons.append(Unsupported(f"mixed.avg_bits {cfg.avg_bits} is below the base format's {base_bits} bits",
                                   f"give at least {base_bits}"))
    if cfg.sensitivity not in MEASURES:
        reasons.append(Unsupported(f"mixed.sensitivity {cfg.sensitivity!r} is not one of {sorted(MEASURES)}",
                                   "--set mixed.sensitivity=fisher (one forward + backward) or kl (exact, slow)"))
    other = [f.by for f in recipe_intents(recipe, SingleScheme)]
    algo = recipe_intent(recipe, WeightRounding, WeightRounding("rtn", "")).algorithm
    views = [v for f in recipe_intents(recipe, ExtraViews) for v in f.views]
    if other or algo in ("awq", "smoothquant") or views:
        what = other[0] if other else (algo if algo in ("awq", "smoothquant") else f"--export {views[0]}")
        reasons.append(Unsupported(f"mixed precision cannot be combined with {what} yet (it handles one scheme)",
                                   "drop the mixed.* settings or that option"))
    return reasons


def _measure(sensitivity: str):
    """The function that measures `sensitivity` (one of MEASURES)."""
    if sensitivity == "fisher":
        from tfcompile.mixed.fisher import measure_fisher  # lazy: runs the model (docs/design.md "Pass modules")
        return measure_fisher
    from tfcompile.mixed.sensitivity import measure  # lazy: runs the model (docs/design.md "Pass modules")
    return measure


@register_pass("mixed", config=MixedConfig, requires=("source", "model", "plan"), produces=("plan",),
               supports=_supports, when=given("mixed"))
def mixed(ctx, cfg: MixedConfig, reporter) -> PassResult:
    """Measure each group's sensitivity per format and pick formats under the budget."""
    plan = ctx.plan
    rounding = recipe_intent(ctx.recipe, WeightRounding, WeightRounding("rtn", ""))
    rule = rounding.mx_rule or plan.scheme.weights.default_rule  # as quantize rounds
    settings = dict(formats=list(cfg.formats), data=cfg.data, samples=cfg.samples, seq_len=cfg.seq_len,
                    seed=cfg.seed, dtype=ctx.model.dtype, mx_rule=rule, sensitivity=cfg.sensitivity)
    key = cache.key(ctx.source, plan, settings)
    hit = cache.load(key) if cfg.cache else None
    if hit is None:
        costs, measured = _measure(cfg.sensitivity)(
            Path(ctx.source.path), plan, list(cfg.formats), data=cfg.data, samples=cfg.samples,
            seq_len=cfg.seq_len, seed=cfg.seed, dtype=torch_dtype(ctx.model.dtype), mx_rule=rule, reporter=reporter)
        cache.store(key, costs, measured)
    else:
        costs, measured = hit
    pick = choose(costs, plan.scheme.name, avg_bits=cfg.avg_bits, max_kl=cfg.max_kl)
    record = {"budget": {"avg_bits": cfg.avg_bits} if cfg.avg_bits else {"max_kl": cfg.max_kl},
              "base": plan.scheme.name, **summary(costs, pick),
              "sensitivity": {**{k: v for k, v in measured.items() if k != "seconds"},
                              "kl": {c.key: {f: round(v, 6) for f, v in c.kl.items()} for c in costs}},
              "groups": dict(pick)}
    new = mixed_plan.apply(plan, pick, ctx.source.names(), record)
    stats = {k: record[k] for k in ("avg_bits", "predicted_kl", "groups_per_format")}
    return PassResult(ctx.with_(plan=new), {**stats, "sensitivity_seconds": measured["seconds"],
                                            "sensitivity_cached": hit is not None})
