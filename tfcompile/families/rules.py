"""Per-family rules: what stays in high precision and why, extra fusion groups, expert layouts.

One rule set per family, in its own module (deepseek.py, glm.py, qwen.py, gpt_oss.py, minimax.py,
bert.py; what a rule set is made of in family.py), gathered here as `FAMILIES`, read by `select`
(what is quantized, which Linears share an NVFP4 global scale), by calibration and eval (how fused
experts are laid out in memory) and by docs/models.md (tests/families/test_families.py
`test_docs_table_lists_every_family_rule` checks the table there lists every rule). A model_type
not in the table gets the generic rules only (`GENERIC`, below).

Generic rules (every model; `passes/select.py` DEFAULT_IGNORE): lm_head, embeddings,
norms and MoE routers (`mlp.gate`, `mlp.router`, `shared_expert_gate`) stay in the
checkpoint dtype. Routers are tiny (E x H), their logits pick the experts, and vLLM
and SGLang build them unquantized (`GateLinear` / `ReplicatedLinear` with no quant
config) whatever the checkpoint says.

`Keep.include` names the `--set select.include=NAME` switch that quantizes a kept
module class anyway (e.g. `select.include=["vision"]`). `Keep.engine_unquantized` marks a
class vLLM builds without a quantization config: quantized anyway, the artifact cannot be
loaded there (tfcompile/artifact/engines.py refuses it for --engine vllm).

The rules are keyed so that the engine's view wins: each cites the vLLM model file and class
that builds the module (vllm/model_executor/models/, read at vLLM 0.32).

A model_type not in the table (GENERIC, `Family.linears == "standard"`) is quantized
conservatively: only the Linears `standard_linear` can show are plain attention / MLP
projections (passes/select.py lists the rest as kept, with the reason).
"""

from __future__ import annotations

import re
from typing import Mapping

from tfcompile.families import bert, deepseek, glm, gpt_oss, minimax, qwen
from tfcompile.families.family import Family, Keep

VISION = Keep(r"re:(^|.*\.)(vision_tower|vision_model|visual|multi_modal_projector|mm_projector|image_newline)"
              r"(\..*)?$", "vision tower and projector",
              "runs once per image, is ~10% of the weights, and its error reaches every image token; engines "
              "build it from the LM's quant config only when it is not in `ignore`", "vision")
# Multi-token-prediction heads (never dropped: checkpoint_check accepts the MTP layers, select keeps
# these and quantizes the MTP decoder block like every other layer, as vLLM builds it with the quant config).
MTP = Keep(r"re:(.*\.)?layers\.\d+\.(eh_proj|shared_head\.head)$",
           "multi-token-prediction projections `eh_proj` and head `shared_head.head` (DeepSeek, GLM)",
           "vLLM's deepseek_mtp.py `DeepSeekMultiTokenPredictorLayer` (glm4_moe_mtp.py alike) builds `eh_proj` "
           "as a plain nn.Linear and `shared_head.head` as a ParallelLMHead: neither takes a packed weight, so "
           "they stay in the checkpoint dtype like the main lm_head", "mtp_head", engine_unquantized=True)

FAMILIES: tuple[Family, ...] = (deepseek.V3, deepseek.V32, glm.GLM_MOE_DSA, deepseek.KIMI_K25, gpt_oss.GPT_OSS,
                                glm.GLM4_MOE, minimax.MINIMAX_M2, qwen.QWEN3, qwen.QWEN3_MOE, qwen.QWEN3_NEXT,
                                qwen.QWEN3_5, qwen.QWEN_VL, bert.BERT, deepseek.V4)
GENERIC = Family("generic", (), linears="standard")
ALWAYS = (VISION, MTP)  # every model, whatever its family
# `select.include=all_linears`: a model type with no rules quantizes every decoder-layer Linear again
ALL_LINEARS = "all_linears"
# The rule sets in force: the in-tree FAMILIES, then any a plugin or test adds with `register_family`
_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
_BY_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}


def register_family(family: Family) -> None:
    """Add a rule set from outside this package (a plugin, a test): every reader here answers with it
    at once. Refuses a family name or a model_type that already has rules."""
    taken = [t for t in family.model_types if t in _BY_TYPE] + ([family.name] if family.name in _BY_NAME else [])
    if taken:
        raise ValueError(f"family {family.name!r}: {taken} already have rules "
                         "(hint: unregister_family the old rule set first, or choose new names)")
    _BY_NAME[family.name] = family
    _BY_TYPE.update({t: family for t in family.model_types})


def unregister_family(name: str) -> None:
    """Remove a rule set `register_family` added (the in-tree ones stay)."""
    if name in {f.name for f in FAMILIES} or name not in _BY_NAME:
        raise ValueError(f"family {name!r} was not registered (hint: only register_family's rule sets go)")
    fam = _BY_NAME.pop(name)
    for t in fam.model_types:
        del _BY_TYPE[t]


def families() -> tuple[Family, ...]:
    """Every rule set in force: FAMILIES, then the registered ones in registration order."""
    return tuple(_BY_NAME.values())


def includes() -> tuple[str, ...]:
    """The `select.include` names: every kept class's switch, and `all_linears`."""
    return tuple(sorted({k.include for f in families() for k in f.keep} | {k.include for k in ALWAYS} | {ALL_LINEARS}))


def family_of(config: Mapping) -> Family:
    """The rules for config.json's model_type, else its text model's (multimodal wrappers)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    return _BY_TYPE.get(config.get("model_type")) or _BY_TYPE.get(text.get("model_type")) or GENERIC


def keep_rules(config: Mapping, include: tuple[str, ...] = ()) -> tuple[Keep, ...]:
    """Modules kept in high precision by default for this model, minus the `include`d classes."""
    return tuple(k for k in ALWAYS + family_of(config).keep if k.include not in include)


# Linear leaves engines fuse into one GEMM over the same input (vLLM's packed_modules_mapping: qkv_proj,
# gate_up_proj, Mixtral's w13, BERT's qkv), beside each family's own roles (`Family.fuse`): the members
# of one role under one parent share one NVFP4 global scale (passes/select.py), and an engine that finds
# them apart requantizes them to the largest (tfcompile/artifact/engines.py warns).
FUSE = {
    "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv",
    "gate_proj": "gate_up", "up_proj": "gate_up",
    "w1": "w13", "w3": "w13",
    "query": "qkv", "key": "qkv", "value": "qkv",
}


def fusion_roles(family: str) -> dict[str, str]:
    """Leaf -> fusion role for family `family` (a manifest's "family")."""
    fam = _BY_NAME.get(family, GENERIC)
    return {**FUSE, **fam.fuse}


def engine_has_no_model(family: str, engine: str) -> bool:
    """True when `engine`'s release has no model class for family `family` (a manifest's "family")."""
    fam = _BY_NAME.get(family, GENERIC)
    return engine in fam.no_model


def engine_unquantized(family: str) -> tuple[Keep, ...]:
    """The kept classes of family `family` (a manifest's "family") that vLLM builds unquantized."""
    fam = _BY_NAME.get(family, GENERIC)
    return tuple(k for k in ALWAYS + fam.keep if k.engine_unquantized)


# What a model type with no rules may quantize: the standard attention and MLP projections of a
# decoder layer, the names every engine's generic loader (vLLM's llama.py / mixtral.py
# `packed_modules_mapping`, transformers' tp plans) maps to its own quantizable Linears.
_BLOCK = r"(^|.*\.)(layers|layer|h|blocks|block)\.\d+\."
_READS = re.compile(_BLOCK + r"((self_attn|attn|attention)\.(q_proj|k_proj|v_proj)|(mlp|feed_forward)\.(gate_proj|up_proj)"
                    r"|(mlp|feed_forward|ffn|block_sparse_moe)\.(shared_experts?\.|experts\.\d+\.)(gate_proj|up_proj|w1|w3))$")
_WRITES = re.compile(_BLOCK + r"((self_attn|attn|attention)\.o_proj|(mlp|feed_forward)\.down_proj"
                     r"|(mlp|feed_forward|ffn|block_sparse_moe)\.(shared_experts?\.|experts\.\d+\.)(down_proj|w2))$")
NOT_STANDARD = ("not a standard attention / MLP projection (q/k/v/o_proj, gate/up/down_proj, experts.N.w1/w2/w3 "
                "of a numbered decoder layer): tfcompile has no rules for this model type, so it cannot show "
                "an engine builds it as a quantizable Linear")
WRONG_SHAPE = "named like a standard projection, but it does not read (q/k/v, gate/up) or write (o, down) the hidden size"


def standard_linear(module: str, shape: tuple[int, int], hidden: int | None) -> str | None:
    """None when `module` ([N, K] = out, in) is a plain attention / MLP projection; else why not."""
    reads, writes = _READS.fullmatch(module), _WRITES.fullmatch(module)
    if not (reads or writes):
        return NOT_STANDARD
    if hidden and (shape[1] if reads else shape[0]) != hidden:
        return WRONG_SHAPE
    return None
