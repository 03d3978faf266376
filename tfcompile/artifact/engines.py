"""What a serving engine can serve: `tfcompile verify --engine`, and quantize's engine checks.

Rules read from the engines' own code (vLLM 0.32, site-packages/vllm; tests/engines runs vLLM on
the artifacts and checks that it refuses exactly what these rules refuse):

- fp8-block (vLLM `fp8_utils.validate_fp8_block_shape`): with tensor parallelism, a row-parallel
  Linear's K / tp and each column-parallel output N / tp must divide the block (128); without it,
  every member of a fused layer (q/k/v, gate/up, ...) but the last must divide it ("Weight
  output_partition_size = 576 is not divisible by weight quantization block_n = 128"); fused-MoE
  experts' intermediate size per partition always (`validate_fp8_block_shape_moe`).
- fp8 static (per-tensor weights): vLLM requantizes every fused group to the group's largest weight
  scale (`w8a8_utils.requantize_with_max_scale`); tfcompile writes the group with that one scale,
  so the requantization is the identity (unequal scales would be served coarser than written).
- NVFP4: a fused layer takes one global scale (the largest, with a warning:
  `CompressedTensorsW4A4Fp4.process_weights_after_loading`).
- KV cache: vLLM's compressed-tensors loader takes only 8-bit float KV schemes
  (`CompressedTensorsKVCacheMethod.validate_kv_cache_scheme`); SGLang has no NVFP4 KV cache;
  TensorRT-LLM serves it (modelopt view) on Blackwell.
- MXFP4 weight-only: vLLM 0.32 builds `CompressedTensorsW4A4Mxfp4` whatever `input_activations`
  says, and runs W4A4 where a W4A4 kernel exists (sm_100 with FlashInfer; vLLM #56770).
- Modules vLLM builds without a quantization config (tfcompile/families/rules.py
  `Keep.engine_unquantized`: the DSA indexer's fused `wk_weights_proj`, deepseek_v2.py `Indexer`;
  the MTP `eh_proj` nn.Linear and `shared_head.head` ParallelLMHead, deepseek_mtp.py): quantized
  (`select.include`), they have no place for `weight_packed` / `weight_scale`: refused.
- Targets: NVFP4 / MXFP4 / MXFP8 W4A4 / W8A8 GEMMs need sm_100; on sm_90 vLLM serves them
  weight-only (Marlin), activations unquantized.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from tfcompile.engines import ENGINES as SERVING_ENGINES
from tfcompile.families import engine_unquantized
from tfcompile.families.rules import engine_has_no_model, fusion_roles
from tfcompile.schemes import SCHEMES, Scheme, get_kv_format

ENGINES = tuple(SERVING_ENGINES)  # tfcompile/engines.py: one declaration per engine
# quantize checks these and warns; naming --engine makes it an error
DEFAULT_ENGINES = tuple(e.name for e in SERVING_ENGINES.values() if e.checked_by_default)
TARGETS = ("sm_90a", "sm_100a")
BLOCK = 128
# fused layers as the engines pack them (vLLM packed_modules_mapping), members in the engine's order
FUSED_ORDER = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1, "q_a_proj": 0,
               "kv_a_proj_with_mqa": 1, "in_proj_qkv": 0, "in_proj_z": 1, "in_proj_b": 0, "in_proj_a": 1}
ROW_PARALLEL = {"o_proj", "down_proj", "out_proj"}
# Linears vLLM replicates on every rank (not split by --tp): deepseek_v2.py builds MLA's q_a_proj +
# kv_a_proj_with_mqa as `DeepSeekV2FusedQkvAProjLinear` (disable_tp=True) and the DSA indexer's wq_b as
# a ReplicatedLinear, so only the unsplit sizes count (what lets DeepSeek-V3's FP8 blocks serve at TP 8).
REPLICATED = {"q_a_proj", "kv_a_proj_with_mqa", "wq_b"}
_EXPERT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj)$")


@dataclass(frozen=True)
class EngineProblem:
    engine: str
    error: bool  # True: the engine refuses to load it; False: it loads but serves something else
    message: str
    hint: str


def engine_problems(doc: Mapping, engine: str, *, target: str | None = None, tp: int = 1) -> list[EngineProblem]:
    """Everything `engine` cannot serve as written in the artifact whose manifest is `doc`."""
    out: list[EngineProblem] = []
    if engine_has_no_model(doc.get("family") or "generic", engine):
        return [EngineProblem(engine, True, f"{engine} 0.32 has no model class for the {doc.get('family')} family "
                              "(its model registry lists none): it cannot load this model in any format",
                              "serve it with an engine that implements the architecture, or a newer release")]
    out += _fp8_block(doc, engine, tp)
    out += _kv_cache(doc, engine)
    out += _unquantized_modules(doc, engine)
    out += _unshared_global_scales(doc, engine)
    out += _weight_only_mxfp4(doc, engine, target)
    out += _target(doc, engine, target)
    out += _online_transform(doc, engine, tp)
    return out


def _fmt(layer: Mapping, doc: Mapping) -> str:
    return layer.get("format") or doc["scheme"]["name"]


def _scheme(layer: Mapping, doc: Mapping) -> Scheme | None:
    """The layer's scheme (mixed precision: its own), whose facts the rules below check; None for a
    name this tfcompile does not know (an artifact of a newer one): no rule applies to it."""
    return SCHEMES.get(_fmt(layer, doc))


# The engine quirks as facts of a scheme (tests/test_format_literals.py: no rule names a format)
def _block_partitioned(s: Scheme | None) -> bool:
    """Weights in 2-D (N, K) blocks (fp8-block): an engine may split a Linear only at block edges."""
    return s is not None and s.granularity == "block"


def _fused_global_scale(s: Scheme | None) -> bool:
    """Block scales under one per-tensor global scale, which an engine-fused layer shares (NVFP4)."""
    return s is not None and s.shares_global_scale


def _weight_only_mx_fp4(s: Scheme | None) -> bool:
    """Weight-only FP4 elements with MX (E8M0, shared-exponent) scales (mxfp4a16): what vLLM 0.32
    builds as `CompressedTensorsW4A4Mxfp4` whatever `input_activations` says (#56770)."""
    return s is not None and s.act is None and s.weights.has_rule and s.weights.packed


def _needs_block_scaled_mma(s: Scheme | None) -> bool:
    """Block-scaled weights and quantized activations (W4A4 / W8A8 MX and NVFP4): a GEMM on FP4/MX
    tensor cores, which sm_90a lacks (engines run them weight-only there)."""
    return s is not None and s.act is not None and s.weights.block_scaled


def _activated(s: Scheme) -> Scheme | None:
    """The scheme with `s`'s weights whose activations are quantized (mxfp4a16 -> mxfp4)."""
    return next((t for t in SCHEMES.values() if t.act is not None and (t.weight, t.granularity, t.block)
                 == (s.weight, s.granularity, s.block)), None)


def _fused(doc: Mapping) -> list[list[Mapping]]:
    """Fused groups as the engine packs them (manifest groups, members in the engine's order)."""
    by_module = {la["module"]: la for la in doc.get("layers", [])}
    groups = []
    for g in doc.get("groups", []):
        members = [by_module[m] for m in g if m in by_module and not _EXPERT.search(m)]
        if len(members) > 1:
            groups.append(sorted(members, key=lambda la: FUSED_ORDER.get(la["module"].rsplit(".", 1)[-1], 9)))
    return groups


def _fp8_block(doc: Mapping, engine: str, tp: int) -> list[EngineProblem]:
    if not SERVING_ENGINES[engine].fp8_block_partitions:
        return []
    bad: list[str] = []
    layers = [la for la in doc.get("layers", []) if _block_partitioned(_scheme(la, doc))]
    grouped = {la["module"] for g in _fused(doc) for la in g}
    for g in _fused(doc):
        if not _block_partitioned(_scheme(g[0], doc)):
            continue
        t = 1 if _leaf(g[0]) in REPLICATED else tp
        members = g if t > 1 else g[:-1]  # merged weights: the last member may end in a partial block
        bad += [_msg(la["module"], la["shape"][0] // t, "output_partition_size", "block_n")
                for la in members if (la["shape"][0] // t) % BLOCK]
    for la in layers:
        n, k = la["shape"]
        leaf = _leaf(la)
        if leaf in REPLICATED:
            continue
        if _EXPERT.search(la["module"]):
            inter = k if leaf == "down_proj" else n
            if (inter // tp) % BLOCK:
                bad.append(_msg(la["module"], inter // tp, "expert intermediate size per partition", "block_n"))
        elif tp > 1 and leaf in ROW_PARALLEL and (k // tp) % BLOCK:
            bad.append(_msg(la["module"], k // tp, "input_size_per_partition", "block_k"))
        elif tp > 1 and la["module"] not in grouped and leaf not in ROW_PARALLEL and (n // tp) % BLOCK:
            bad.append(_msg(la["module"], n // tp, "output_partition_size", "block_n"))
    if not bad:
        return []
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return [EngineProblem(engine, True, f"{engine} refuses fp8-block at --tp {tp}: " + "; ".join(sorted(set(bad))[:3])
                          + more, "use --format fp8-dynamic (per-channel: no block constraint), or keep those "
                          "modules in bf16 with --ignore PATTERN; --tp must split every partition into whole "
                          "128-blocks")]


def _leaf(layer: Mapping) -> str:
    return layer["module"].rsplit(".", 1)[-1]


def _msg(module: str, size: int, what: str, block: str) -> str:
    return f"{module}: Weight {what} = {size} is not divisible by weight quantization {block} = {BLOCK}"


def _kv_cache(doc: Mapping, engine: str) -> list[EngineProblem]:
    kv = doc["scheme"].get("kv_cache")
    if not kv or kv.get("dtype") in SERVING_ENGINES[engine].kv_dtypes:
        return []
    return [EngineProblem(engine, True, f"{engine} does not serve an NVFP4 KV cache (vLLM 0.32: 'Currently "
                          "supported kv cache quantization is num_bits=8, type=float')",
                          "use --kv-cache fp8 for vllm/sglang; --kv-cache nvfp4 is for --engine trtllm "
                          "(--export modelopt)")]


def _unquantized_modules(doc: Mapping, engine: str) -> list[EngineProblem]:
    if not SERVING_ENGINES[engine].builds_unquantized:  # read from vLLM's model code; others not checked
        return []
    rules = engine_unquantized(doc.get("family") or "generic")
    bad = [(la["module"], k) for la in doc.get("layers", []) for k in rules if k.matches(la["module"])]
    if not bad:
        return []
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    shown = "; ".join(f"{m} ({k.what})" for m, k in bad[:3])
    includes = ", ".join(sorted({k.include for _, k in bad}))
    return [EngineProblem(engine, True, f"vllm builds these without a quantization config and cannot load them "
                          f"quantized: {shown}{more}", f"drop {includes} from select.include (they stay in the "
                          "checkpoint dtype by default)")]


def _unshared_global_scales(doc: Mapping, engine: str) -> list[EngineProblem]:
    """NVFP4 members of one engine-fused layer (families.rules.fusion_roles) outside one manifest group:
    their global scales differ, and the engine serves them all with the largest (vLLM
    `CompressedTensorsW4A4Fp4.process_weights_after_loading`, with a warning): coarser than written."""
    roles = fusion_roles(doc.get("family") or "generic")
    group_of = {m: i for i, g in enumerate(doc.get("groups", [])) for m in g}
    fused: dict[tuple[str, str], list[str]] = {}
    for la in doc.get("layers", []):
        parent, _, leaf = la["module"].rpartition(".")
        if leaf in roles and _fused_global_scale(_scheme(la, doc)):
            fused.setdefault((parent, roles[leaf]), []).append(la["module"])
    bad = sorted(sorted(ms) for ms in fused.values() if len({group_of.get(m, m) for m in ms}) > 1)
    if not bad:
        return []
    more = f" (and {len(bad) - 1} more fused layers)" if len(bad) > 1 else ""
    return [EngineProblem(engine, False, f"{engine} fuses {' + '.join(bad[0])} into one layer with one "
                          f"NVFP4 global scale{more}, but they were written with their own: it serves them all "
                          "with the largest, coarser than written", "drop --set select.fuse_groups=false: "
                          "select gives each fused group one shared global scale")]


def _weight_only_mxfp4(doc: Mapping, engine: str, target: str | None) -> list[EngineProblem]:
    if not SERVING_ENGINES[engine].mxfp4a16_as_w4a4 or not any(_weight_only_mx_fp4(_scheme(la, doc))
                                                                for la in doc.get("layers", [])):
        return []
    where = "on sm_100a" if target == "sm_100a" else "where a W4A4 kernel exists (sm_100 + FlashInfer)"
    return [EngineProblem(engine, False, f"vllm 0.32 reads mxfp4a16 as W4A4 MXFP4 {where}: activations get "
                          "quantized although the artifact says weight-only (vLLM #56770)",
                          "`tfcompile eval --served-on vllm:sm_100a` scores what vLLM serves there; on sm_90a "
                          "it runs weight-only (Marlin)")]


def _online_transform(doc: Mapping, engine: str, tp: int) -> list[EngineProblem]:
    """An online input transform (quantize.online_hadamard: the weights are stored as W R) served by an engine
    that does not apply x R computes garbage; vLLM applies it on one GPU only."""
    t = doc["scheme"].get("online_transform")
    if not t:
        return []
    if not SERVING_ENGINES[engine].online_transforms:
        return [EngineProblem(engine, True, f"{engine} does not apply compressed-tensors' online transforms "
                              f"(transform_config): the weights are stored as W R for an online {t.get('type')} "
                              f"transform of order {t.get('order')}, so its outputs would be wrong",
                              "serve it with vllm, or quantize without quantize.online_hadamard")]
    if tp > 1:
        return [EngineProblem(engine, True, f"{engine} applies online transforms only without tensor parallelism "
                              "(compressed_tensors/transform/module.py: 'Online transforms with tensor "
                              "parallelism is not supported')", "serve it at --tp 1")]
    return []


def _target(doc: Mapping, engine: str, target: str | None) -> list[EngineProblem]:
    if target != "sm_90a":
        return []
    fmts = sorted({_fmt(la, doc) for la in doc.get("layers", []) if _needs_block_scaled_mma(_scheme(la, doc))})
    if not fmts:
        return []
    return [EngineProblem(engine, False, f"{', '.join(fmts)}: sm_90a has no FP4/MX tensor cores; {engine} serves "
                          "them weight-only (Marlin), activations unquantized", "--target sm_100a, or --format "
                          "nvfp4a16 / fp8-dynamic for Hopper")]


# ENGINE:TARGET -> whether the engine reads a weight-only MXFP4 artifact there as W4A4 (`tfcompile eval
# --served-on`): vLLM 0.32 builds CompressedTensorsW4A4Mxfp4 with kMxfp4Dynamic activations for it, and
# on sm_100 its first MXFP4 kernel, FlashInfer's, quantizes them (kernels/linear/mxfp4/flashinfer.py);
# on sm_90 Marlin runs weight-only, as written (#56770). The formats it applies to are the scheme
# facts `_weight_only_mx_fp4` checks.
SERVED_ON = {"vllm:sm_100a": True, "vllm:sm_90a": False}


def served_activations(served_on: str | None) -> dict[str, str]:
    """`eval --served-on ENGINE:TARGET` -> {written format: the format whose activation emulation runs}."""
    if served_on is None:
        return {}
    if served_on not in SERVED_ON:
        raise ValueError(f"unknown --served-on {served_on!r}; choose one of: {', '.join(SERVED_ON)}")
    if not (SERVED_ON[served_on] and SERVING_ENGINES[served_on.partition(":")[0]].mxfp4a16_as_w4a4):
        return {}
    return {s.name: t.name for s in SCHEMES.values() if _weight_only_mx_fp4(s) and (t := _activated(s))}


def check_engines(doc: Mapping, engines: Iterable[str], **kw) -> list[EngineProblem]:
    return [p for e in engines for p in engine_problems(doc, e, **kw)]


def plan_view(plan, kv_cache: str | None = None, online: int = 0) -> dict:
    """The manifest fields these rules read, from a `QuantPlan` (tfcompile/ir.py) before anything is
    quantized: `plan --estimate` asks the engines from config.json alone. `kv_cache`: calibrate.kv_cache;
    `online`: the order of quantize.online_hadamard (0: none)."""
    kv = {"dtype": get_kv_format(kv_cache).dtype} if kv_cache else None
    transform = {"online_transform": {"type": "hadamard", "order": online}} if online else {}
    return {"scheme": {"name": plan.scheme.name, "kv_cache": kv, **transform}, "family": plan.family,
            "layers": [{"module": t.module, "shape": list(t.shape), "format": plan.scheme_of(g).name}
                       for g in plan.groups for t in g.members],
            "groups": [[t.module for t in g.members] for g in plan.groups if len(g.members) > 1]}


def engine_record(problems: list[EngineProblem], engines: Iterable[str]) -> dict:
    """{engine: {"verdict", "problems": [{"error", "message", "hint"}]}} for --json output."""
    out = {}
    for e in engines:
        mine = [p for p in problems if p.engine == e]
        verdict = "refuses" if any(p.error for p in mine) else "warns" if mine else "serves it as written"
        out[e] = {"verdict": verdict, "problems": [{"error": p.error, "message": p.message, "hint": p.hint}
                                                   for p in mine]}
    return out
