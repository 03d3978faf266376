"""`select`: decide from the checkpoint what is quantized, and in which groups.

Rules (docs/design.md):
- Candidates are the Linear weights of decoder layers: 2-D floating `*.weight`
  tensors under a numbered layer prefix (`layers.3.`, `layer.3.`, `h.3.`,
  `blocks.3.`), and MoE experts stored fused as 3-D tensors
  (transformers v5 `experts.gate_up_proj` / `experts.down_proj`, in the family's
  layout: tfcompile/families/experts.py) which are split into per-expert Linear
  weights; GPT-OSS's fused expert biases are split the same way (`QuantPlan.splits`).
- A default ignore list (lm_head, embeddings, norms, MoE router gates) plus the
  model family's kept modules (tfcompile/families/rules.py: vision towers, MLA's
  kv_b_proj, linear attention; `select.include` quantizes a kept class anyway) is
  extended by `--ignore` (globs, or regexes prefixed `re:`).
- A model type with no rules (families GENERIC) is quantized conservatively: only the
  Linears `families.rules.standard_linear` shows are plain attention / MLP projections
  (standard names, reading or writing the hidden size); the rest is kept and listed
  (stats `kept_no_rules`, one warning); `select.include=all_linears` quantizes them all.
- Every 2-D weight that is not quantized and is not an embedding goes into the
  artifact's `ignore` list, so loaders leave that Linear in high precision.
- Linears that engines fuse (q/k/v, gate/up, MoE w1/w3, BERT query/key/value)
  form one group; NVFP4 gives a group one shared global scale.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from tfcompile.errors import CheckpointError, FormatError, RecipeError
from tfcompile.families import Family, family_of, includes, keep_rules
from tfcompile.families.rules import ALL_LINEARS, fusion_roles, standard_linear
from tfcompile.families.experts import bias_slices, split_slices
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.safetensors_header import TensorInfo
from tfcompile.ir import ModelInfo, QuantGroup, QuantPlan, QuantTarget, Split
from tfcompile.pipeline.intents import SharedGlobalScales
from tfcompile.pipeline.passes import PassResult, Unsupported, check, register_pass
from tfcompile.recipe import Recipe
from tfcompile.schemes import Scheme, get_scheme

DEFAULT_IGNORE = (
    r"re:(^|.*\.)lm_head$",
    r"re:.*(embed_tokens|embeddings|wte|wpe|embed_positions).*",
    r"re:.*norm.*",
    r"re:.*\.(mlp|block_sparse_moe|moe|feed_forward)\.(gate|router)$",
    r"re:.*(router|shared_expert_gate)$",
)
_LAYER = re.compile(r"(^|\.)(layers|layer|h|blocks|block)\.\d+\.")
_FLOAT = {"BF16", "F16", "F32"}


@dataclass(frozen=True)
class SelectConfig:
    format: str = "nvfp4"
    ignore: tuple[str, ...] = ()  # extra patterns: globs over module names, or "re:<regex>"
    use_default_ignore: bool = True
    fuse_groups: bool = True  # group q/k/v and gate/up (shared NVFP4 global scale)
    include: tuple[str, ...] = ()  # kept module classes to quantize anyway: vision, mla_kv_b, ... (families.includes)


def _supports(recipe: Recipe, cfg: SelectConfig) -> list[Unsupported]:
    reasons = check(get_scheme, cfg.format)  # names the valid formats
    for p in cfg.ignore:
        reasons += check(_compile, p)
    bad = [i for i in cfg.include if i not in includes()]
    if bad:
        reasons.append(Unsupported(f"select.include {bad}: unknown module class",
                                   "choose from: " + ", ".join(includes())))
    return reasons


@register_pass("select", config=SelectConfig, requires=("source", "model"), produces=("plan",),
               supports=_supports, intents=lambda c: (SharedGlobalScales(c.fuse_groups),))
def select(ctx, cfg: SelectConfig, reporter) -> PassResult:
    """Choose the Linear weights to quantize and group the ones engines fuse."""
    scheme = get_scheme(cfg.format)
    family = family_of(ctx.source.config)
    keep = tuple(k.pattern for k in keep_rules(ctx.source.config, cfg.include))
    patterns = [_compile(p) for p in (DEFAULT_IGNORE + keep if cfg.use_default_ignore else ()) + cfg.ignore]
    targets, ignored, consumed, embeddings = [], set(), set(), set()
    unproven: dict[str, str] = {}  # no rules for this model type: module -> why it is kept
    conservative = family.linears == "standard" and ALL_LINEARS not in cfg.include
    for name in ctx.source.names():
        info = ctx.source.info(name)
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        found = _candidates(name, module, info, ctx.model, family)
        if found is None:
            if len(info.shape) == 2 and name.endswith(".weight"):
                (embeddings if _is_embedding(module) else ignored).add(module)
            continue
        if any(p(module) for p in patterns) or any(p(t.module) for t in found for p in patterns):
            ignored.update(t.module for t in found)
            continue
        if conservative and _unproven(found, ctx.model.hidden_size, unproven):
            ignored.update(t.module for t in found)
            continue
        _check_target(name, info, scheme)
        targets.extend(found)
        consumed.add(name)
    if ctx.model.tie_word_embeddings or "lm_head.weight" not in ctx.source.names():
        ignored.add("lm_head")  # a tied lm_head is a Linear with no tensor of its own
    groups = _group(targets, cfg.fuse_groups, fusion_roles(family.name))
    splits = _bias_splits(ctx.source, {t.source for t in targets if t.expert is not None}, family)
    passthrough = tuple(n for n in ctx.source.names() if n not in consumed and n not in splits)
    plan = QuantPlan(scheme, groups, passthrough, tuple(sorted(ignored)), tuple(sorted(embeddings)),
                     frozenset(consumed), splits=splits, family=family.name)
    stats = {"family": family.name, "quantized_linears": len(targets), "groups": len(groups),
             "ignored_linears": len(ignored), "passthrough_tensors": len(passthrough)}
    if unproven:
        stats["kept_no_rules"] = _kept_summary(unproven)
        reporter.warn(_kept_warning(ctx.model.model_type, stats["kept_no_rules"]))
    return PassResult(ctx.with_(plan=plan), stats)


def _unproven(found: list[QuantTarget], hidden: int | None, out: dict[str, str]) -> bool:
    """Record (in `out`) the targets `standard_linear` cannot show are plain projections; True if any."""
    why = {t.module: w for t in found if (w := standard_linear(t.module, t.shape, hidden))}
    out.update(why)
    return bool(why)


def _kept_summary(kept: dict[str, str]) -> list[dict]:
    """Kept modules by name pattern (layer and expert numbers as *): [{"modules", "count", "why"}]."""
    rows: dict[tuple[str, str], int] = {}
    for module, why in kept.items():
        key = (re.sub(r"\.\d+\.", ".*.", module), why)
        rows[key] = rows.get(key, 0) + 1
    return [{"modules": m, "count": n, "why": w} for (m, w), n in sorted(rows.items())]


def _kept_warning(model_type: str, rows: list[dict]) -> str:
    listed = "; ".join(f"{r['modules']} ({r['count']}): {r['why']}" for r in rows[:6])
    more = f"; and {len(rows) - 6} more patterns (--json: passes.select.kept_no_rules)" if len(rows) > 6 else ""
    return (f"select: model_type {model_type!r} has no tfcompile rules (docs/models.md), so only standard "
            f"attention / MLP Linears were quantized; kept in the checkpoint dtype: {listed}{more}\n"
            "hint: --set 'select.include=[\"all_linears\"]' quantizes every decoder-layer Linear (check first "
            "that your engine builds them with the quantization config); --ignore PATTERN keeps more")


def _compile(pattern: str):
    if pattern.startswith("re:"):
        try:
            rx = re.compile(pattern[3:])
        except re.error as e:
            raise RecipeError(f"--ignore {pattern!r}: invalid regex ({e})",
                              hint="regexes start with re: and use Python syntax") from None
        return lambda m: rx.fullmatch(m) is not None
    return lambda m: fnmatch.fnmatchcase(m, pattern)


def _is_embedding(module: str) -> bool:
    return re.search(r"(embed|wte|wpe)", module) is not None


def _candidates(name: str, module: str, info: TensorInfo, model: ModelInfo,
                family: Family) -> list[QuantTarget] | None:
    """The Linear weight(s) this tensor holds, or None if it holds none."""
    if not _LAYER.search(name):
        return None
    shape = tuple(info.shape)
    if len(shape) == 2 and name.endswith(".weight"):
        return [QuantTarget(module, name, None, None, (shape[0], shape[1]))]
    if len(shape) == 3 and re.search(r"experts\.(gate_up_proj|down_proj)(\.weight)?$", name):
        return [QuantTarget(s.module, name, s.expert, s.rows, s.shape, transposed=s.transposed)
                for s in split_slices(name, shape, model.hidden_size, family.experts)]
    return None


def _bias_splits(source: Checkpoint, fused: set[str], family: Family) -> dict[str, tuple[Split, ...]]:
    """GPT-OSS-style fused expert biases of the split weights: source -> per-expert slices."""
    out = {}
    for w in sorted(fused):
        name = (w[: -len(".weight")] if w.endswith(".weight") else w) + "_bias"
        if family.experts.bias and name in source.names():
            out[name] = tuple(bias_slices(name, tuple(source.info(name).shape), family.experts))
    return out


def _check_target(name: str, info: TensorInfo, scheme: Scheme) -> None:
    if info.dtype not in _FLOAT:
        hint = ("the checkpoint looks already quantized; start from the bf16 original"
                if info.dtype.startswith(("F8", "U8", "I8")) else "convert it to bf16/fp16/fp32")
        raise CheckpointError(f"tensor {name} has dtype {info.dtype}; only BF16, F16 and F32 "
                              f"weights can be quantized", hint=hint)
    k = info.shape[-1]
    if k % scheme.k_multiple:
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        raise FormatError(
            f"tensor {name}: in_features {k} is not a multiple of {scheme.k_multiple}, "
            f"the {scheme.name} block size",
            hint=f"leave it in high precision with --ignore '{module}'")


def _group(targets: list[QuantTarget], fuse: bool, roles: dict[str, str]) -> tuple[QuantGroup, ...]:
    """Group targets by parent module and fusion role (families.rules.fusion_roles); deterministic order."""
    groups: dict[str, list[QuantTarget]] = {}
    for t in targets:
        parent, _, leaf = t.module.rpartition(".")
        role = roles.get(leaf) if fuse else None
        key = f"{parent}.{role}" if role else t.module
        groups.setdefault(key, []).append(t)
    return tuple(QuantGroup(k, tuple(v)) for k, v in sorted(groups.items(), key=lambda kv: _natural(kv[0])))


def _natural(s: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]
