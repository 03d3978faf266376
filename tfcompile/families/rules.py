"""Per-family rules: what stays in high precision and why, extra fusion groups, expert layouts.

One table (`FAMILIES`), read by `select` (what is quantized, which Linears share an
NVFP4 global scale), by calibration and eval (how fused experts are laid out in
memory) and by docs/models.md (tests/families/test_docs.py checks the table there
lists every rule here). A model_type not in the table gets the generic rules only.

Generic rules (every model; `passes/select.py` DEFAULT_IGNORE): lm_head, embeddings,
norms and MoE routers (`mlp.gate`, `mlp.router`, `shared_expert_gate`) stay in the
checkpoint dtype. Routers are tiny (E x H), their logits pick the experts, and vLLM
and SGLang build them unquantized (`GateLinear` / `ReplicatedLinear` with no quant
config) whatever the checkpoint says.

`Keep.include` names the `--set select.include=NAME` switch that quantizes a kept
module class anyway (e.g. `select.include=["vision"]`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Keep:
    pattern: str  # select's syntax: a glob, or "re:<regex>" matched against the module name
    what: str  # the modules, in words (docs/models.md)
    why: str  # why they stay in high precision by default
    include: str  # `select.include` name that quantizes them anyway


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


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json model_type values
    keep: tuple[Keep, ...] = ()  # kept in high precision by default (beyond the generic rules)
    fuse: Mapping[str, str] = field(default_factory=dict)  # Linear leaf -> fusion role (one global scale)
    experts: ExpertLayout = V5  # layout of fused expert tensors, when the checkpoint stores them fused
    modelopt: bool = False  # TensorRT-LLM serves it: the modelopt view is tested (tests/families)


FAMILIES: tuple[Family, ...] = (
    Family("deepseek_v3", ("deepseek_v3", "kimi_k2"), keep=(
        Keep(r"re:.*\.self_attn\.kv_b_proj$", "MLA kv_b_proj (latent -> per-head K_nope, V)",
             "engines absorb it into the query and output projections at load and keep the result in bf16 "
             "(vLLM's MLA dequantizes a quantized kv_b_proj: no quantized bmm for W_UK/W_UV), so quantizing "
             "it saves no serving memory or time and only adds error", "mla_kv_b"),),
        # vLLM's DeepSeek loader fuses q_a_proj and kv_a_proj_with_mqa into `fused_qkv_a_proj` (one GEMM
        # over the same input), so they need one NVFP4 global scale like q/k/v.
        fuse={"q_a_proj": "qkv_a", "kv_a_proj_with_mqa": "qkv_a"}, modelopt=True),
    Family("gpt_oss", ("gpt_oss",), experts=GPT_OSS, modelopt=True),
    Family("glm4_moe", ("glm4_moe",)),
    Family("qwen3", ("qwen3",), modelopt=True),
    Family("qwen3_moe", ("qwen3_moe",), modelopt=True),
    Family("qwen3_next", ("qwen3_next",), keep=(
        Keep(r"re:.*\.linear_attn\..*", "Gated DeltaNet projections (in_proj_qkvz, in_proj_ba, out_proj)",
             "they feed a recurrent state that carries their error through the whole sequence (no KV cache "
             "resets it); peers keep them bf16 (llm-compressor's Qwen3-Next/3.5 recipes ignore "
             "`re:.*linear_attn.*`)", "linear_attn"),)),
    Family("qwen2_5_vl", ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe")),
)
GENERIC = Family("generic", ())
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
INCLUDES = tuple(sorted({k.include for f in FAMILIES for k in f.keep} | {VISION.include}))


def family_of(config: Mapping) -> Family:
    """The rules for config.json's model_type, else its text model's (multimodal wrappers)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    return _BY_TYPE.get(config.get("model_type")) or _BY_TYPE.get(text.get("model_type")) or GENERIC


def keep_rules(config: Mapping, include: tuple[str, ...] = ()) -> tuple[Keep, ...]:
    """Modules kept in high precision by default for this model, minus the `include`d classes."""
    return tuple(k for k in (VISION,) + family_of(config).keep if k.include not in include)
