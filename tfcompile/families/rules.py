"""Per-family rules: what stays in high precision and why, extra fusion groups, expert layouts.

One table (`FAMILIES`), read by `select` (what is quantized, which Linears share an
NVFP4 global scale), by calibration and eval (how fused experts are laid out in
memory) and by docs/models.md (tests/families/test_families.py `test_docs_table_lists_every_family_rule` checks the table there
lists every rule here). A model_type not in the table gets the generic rules only.

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
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Keep:
    pattern: str  # select's syntax: a glob, or "re:<regex>" matched against the module name
    what: str  # the modules, in words (docs/models.md)
    why: str  # why they stay in high precision by default
    include: str  # `select.include` name that quantizes them anyway
    engine_unquantized: bool = False  # vLLM builds it with quant_config=None / as a plain nn.Linear

    def matches(self, module: str) -> bool:
        """`pattern` (every rule here is a "re:" regex) matches the whole module name."""
        return re.fullmatch(self.pattern.removeprefix("re:"), module) is not None


@dataclass(frozen=True)
class ExpertLayout:
    """How a family stores its routed experts as fused 3-D tensors (transformers v5 names)."""
    name: str  # "v5": [E, 2I, H] gate then up halves; "gpt_oss": [E, H, 2I] interleaved, + biases
    transposed: bool  # stored (in, out): gate_up [E, H, 2I], down [E, I, H]
    interleaved: bool  # gate/up alternate along 2I (gate = 0::2, up = 1::2) instead of halves
    bias: bool  # gate_up_proj_bias [E, 2I] and down_proj_bias [E, H] beside the weights


V5 = ExpertLayout("v5", transposed=False, interleaved=False, bias=False)
GPT_OSS = ExpertLayout("gpt_oss", transposed=True, interleaved=True, bias=True)

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
# Qwen3.5's MTP input projection: qwen3_5_mtp.py `Qwen3_5MultiTokenPredictor.fc` is a ColumnParallelLinear
# with the quant config, but the published NVFP4 releases store it bf16 (vLLM forces it unquantized for
# modelopt, vLLM #38650): kept, like the peers; its decoder block `mtp.layers.0` is quantized.
MTP_FC = Keep(r"re:(.*\.)?mtp\.fc$", "Qwen3.5 MTP input projection `mtp.fc` ([H, 2H])",
              "the published releases keep it bf16 and vLLM forces it unquantized for modelopt checkpoints "
              "(qwen3_5_mtp.py, vLLM #38650); it is one small GEMM per drafted token", "mtp_head")
MLA_KV_B = Keep(r"re:.*\.self_attn\.kv_b_proj$", "MLA kv_b_proj (latent -> per-head K_nope, V)",
                "engines absorb it into the query and output projections at load and keep the result in bf16 "
                "(vLLM's MLA dequantizes a quantized kv_b_proj: no quantized bmm for W_UK/W_UV), so quantizing "
                "it saves no serving memory or time and only adds error", "mla_kv_b")
# vLLM's DeepSeek loader fuses q_a_proj and kv_a_proj_with_mqa into `fused_qkv_a_proj` (one GEMM over the
# same input; deepseek_v2.py `DeepSeekV2FusedQkvAProjLinear`), so they need one NVFP4 global scale like q/k/v.
MLA_FUSE = {"q_a_proj": "qkv_a", "kv_a_proj_with_mqa": "qkv_a"}
# DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): vLLM's deepseek_v2.py `Indexer`
# fuses wk [index_head_dim, H] and weights_proj [index_n_heads, H] into one `wk_weights_proj`
# (MergedColumnParallelLinear, quant_config=None; an FP8 wk is upcast to bf16 at load), so they are
# served bf16 whatever the checkpoint says; its wq_b (ReplicatedLinear with the quant config) is quantized.
DSA_INDEXER = Keep(r"re:.*\.indexer\.(wk|weights_proj)$", "DSA lightning indexer wk + weights_proj",
                   "vLLM fuses them into `wk_weights_proj`, built with quant_config=None (deepseek_v2.py "
                   "`Indexer`): it cannot load them packed; the published V3.2 keeps weights_proj in fp32 and "
                   "NVIDIA's NVFP4 releases keep the indexer unquantized", "dsa_indexer", engine_unquantized=True)
# Kimi K2.5 / K2.6 (`Kimi_K25ForConditionalGeneration`): the Kimi K2 language model beside the MoonViT tower
# (`vision_tower.encoder.blocks.N.wqkv / wo / mlp.fc0 / fc1`) and its projector (`mm_projector.proj.0 / .2`).
# vLLM's kimi_k25.py `KimiK25ForConditionalGeneration._maybe_ignore_quant_config` builds both with
# quant_config=None for a compressed-tensors checkpoint: quantized, they cannot be loaded there.
K25_TOWER = Keep(r"re:(^|.*\.)(vision_tower|mm_projector)(\..*)?$", "MoonViT vision tower and `mm_projector`",
                 "vLLM's kimi_k25.py builds them with quant_config=None for compressed-tensors checkpoints "
                 "(`_maybe_ignore_quant_config`), so it cannot load them packed; the published K2.5 keeps them bf16",
                 "vision", engine_unquantized=True)
LINEAR_ATTN = Keep(r"re:.*\.linear_attn\..*", "Gated DeltaNet projections (in_proj_qkvz / in_proj_qkv + "
                   "in_proj_z, in_proj_ba / in_proj_b + in_proj_a, out_proj)",
                   "they feed a recurrent state that carries their error through the whole sequence (no KV cache "
                   "resets it); peers keep them bf16 (llm-compressor's Qwen3-Next/3.5 recipes ignore "
                   "`re:.*linear_attn.*`)", "linear_attn")
# Qwen3.5 splits what Qwen3-Next stores fused; vLLM's qwen3_5.py `Qwen3_5ForCausalLMBase.packed_modules_mapping`
# loads in_proj_qkv + in_proj_z as `in_proj_qkvz` and in_proj_b + in_proj_a as `in_proj_ba`: with
# select.include=linear_attn each pair is one group (one NVFP4 global scale), as q/k/v are.
QWEN3_5_FUSE = {"in_proj_qkv": "qkvz", "in_proj_z": "qkvz", "in_proj_b": "ba", "in_proj_a": "ba"}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json model_type values
    keep: tuple[Keep, ...] = ()  # kept in high precision by default (beyond the generic rules)
    fuse: Mapping[str, str] = field(default_factory=dict)  # Linear leaf -> fusion role (one global scale)
    experts: ExpertLayout = V5  # layout of fused expert tensors, when the checkpoint stores them fused
    modelopt: bool = False  # TensorRT-LLM serves it: the modelopt view is tested (tests/families)
    linears: str = "all"  # "all": every decoder-layer Linear; "standard": only what standard_linear shows
    no_model: tuple[str, ...] = ()  # engines whose release (vLLM 0.32) has no model class for it: refused


FAMILIES: tuple[Family, ...] = (
    Family("deepseek_v3", ("deepseek_v3", "kimi_k2"), keep=(MLA_KV_B,), fuse=MLA_FUSE, modelopt=True),
    # DeepSeek-V3.2 and GLM-5: MLA as V3 plus the DSA indexer; vLLM serves both with deepseek_v2.py
    # (`DeepseekV2MLAAttention`, is_v32 when the config has index_topk).
    Family("deepseek_v32", ("deepseek_v32",), keep=(MLA_KV_B, DSA_INDEXER), fuse=MLA_FUSE),
    Family("glm_moe_dsa", ("glm_moe_dsa",), keep=(MLA_KV_B, DSA_INDEXER), fuse=MLA_FUSE),
    # Kimi K2.5: its text model is Kimi K2 (`language_model.model.*`, served by vLLM's DeepseekV2ForCausalLM
    # inside kimi_k25.py), so the K2 rules plus the tower vLLM builds unquantized.
    Family("kimi_k25", ("kimi_k25",), keep=(MLA_KV_B, K25_TOWER), fuse=MLA_FUSE),
    Family("gpt_oss", ("gpt_oss",), experts=GPT_OSS, modelopt=True),
    Family("glm4_moe", ("glm4_moe",)),
    # MiniMax-M2: GQA + experts `block_sparse_moe.experts.{e}.w1/w2/w3` (w1/w3 one group), router
    # `block_sparse_moe.gate` kept (vLLM minimax_m2.py `MiniMaxM2MoE`: ReplicatedLinear, quant_config=None).
    Family("minimax_m2", ("minimax_m2",)),
    Family("qwen3", ("qwen3",), modelopt=True),
    Family("qwen3_moe", ("qwen3_moe",), modelopt=True),
    Family("qwen3_next", ("qwen3_next",), keep=(LINEAR_ATTN,)),
    # Qwen3.5 dense and MoE (Gated DeltaNet : gated attention 3:1, MTP `mtp.*`, vision tower `model.visual`).
    Family("qwen3_5", ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), keep=(LINEAR_ATTN, MTP_FC),
           fuse=QWEN3_5_FUSE),
    Family("qwen2_5_vl", ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe")),
    # BERT encoders (MiniLM): every encoder-layer Linear is one vLLM builds with quant_config (bert.py:
    # BertSelfAttention's QKVParallelLinear packs query/key/value, BertSelfOutput / BertOutput
    # RowParallelLinear `dense`, BertIntermediate ColumnParallelLinear); the pooler is outside the layers.
    Family("bert", ("bert",)),
    # DeepSeek-V4 (hyper-connections, compressed sparse attention, hash-routed MoE): vLLM 0.32 registers no
    # model class for DeepseekV4ForCausalLM (only its chat parsers), so nothing here is read from an engine
    # and the model is quantized by the conservative rules of a model type with none (its experts'
    # w1/w2/w3 under `ffn`); its published FP8 / FP4 checkpoint is read (io/sources/deepseek_v4.py).
    Family("deepseek_v4", ("deepseek_v4",), linears="standard", no_model=("vllm",)),
)
GENERIC = Family("generic", (), linears="standard")
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
ALWAYS = (VISION, MTP)  # every model, whatever its family
# `select.include=all_linears`: a model type with no rules quantizes every decoder-layer Linear again
ALL_LINEARS = "all_linears"
INCLUDES = tuple(sorted({k.include for f in FAMILIES for k in f.keep} | {k.include for k in ALWAYS} | {ALL_LINEARS}))


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
    fam = next((f for f in FAMILIES if f.name == family), GENERIC)
    return {**FUSE, **fam.fuse}


def engine_has_no_model(family: str, engine: str) -> bool:
    """True when `engine`'s release has no model class for family `family` (a manifest's "family")."""
    fam = next((f for f in FAMILIES if f.name == family), GENERIC)
    return engine in fam.no_model


def engine_unquantized(family: str) -> tuple[Keep, ...]:
    """The kept classes of family `family` (a manifest's "family") that vLLM builds unquantized."""
    fam = next((f for f in FAMILIES if f.name == family), GENERIC)
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
