"""Qwen's family rules: Qwen3 dense and MoE, Qwen3-Next and Qwen3.5 (Gated DeltaNet kept, Qwen3.5's
MTP input projection kept, its split projections fused as vLLM loads them), and the Qwen-VL models."""

from __future__ import annotations

from tfcompile.families.family import Family, Keep

# Qwen3.5's MTP input projection: qwen3_5_mtp.py `Qwen3_5MultiTokenPredictor.fc` is a ColumnParallelLinear
# with the quant config, but the published NVFP4 releases store it bf16 (vLLM forces it unquantized for
# modelopt, vLLM #38650): kept, like the peers; its decoder block `mtp.layers.0` is quantized.
MTP_FC = Keep(r"re:(.*\.)?mtp\.fc$", "Qwen3.5 MTP input projection `mtp.fc` ([H, 2H])",
              "the published releases keep it bf16 and vLLM forces it unquantized for modelopt checkpoints "
              "(qwen3_5_mtp.py, vLLM #38650); it is one small GEMM per drafted token", "mtp_head")
LINEAR_ATTN = Keep(r"re:.*\.linear_attn\..*", "Gated DeltaNet projections (in_proj_qkvz / in_proj_qkv + "
                   "in_proj_z, in_proj_ba / in_proj_b + in_proj_a, out_proj)",
                   "they feed a recurrent state that carries their error through the whole sequence (no KV cache "
                   "resets it); peers keep them bf16 (llm-compressor's Qwen3-Next/3.5 recipes ignore "
                   "`re:.*linear_attn.*`)", "linear_attn")
# Qwen3.5 splits what Qwen3-Next stores fused; vLLM's qwen3_5.py `Qwen3_5ForCausalLMBase.packed_modules_mapping`
# loads in_proj_qkv + in_proj_z as `in_proj_qkvz` and in_proj_b + in_proj_a as `in_proj_ba`: with
# select.include=linear_attn each pair is one group (one NVFP4 global scale), as q/k/v are.
QWEN3_5_FUSE = {"in_proj_qkv": "qkvz", "in_proj_z": "qkvz", "in_proj_b": "ba", "in_proj_a": "ba"}

QWEN3 = Family("qwen3", ("qwen3",), modelopt=True)
QWEN3_MOE = Family("qwen3_moe", ("qwen3_moe",), modelopt=True)
QWEN3_NEXT = Family("qwen3_next", ("qwen3_next",), keep=(LINEAR_ATTN,))
# Qwen3.5 dense and MoE (Gated DeltaNet : gated attention 3:1, MTP `mtp.*`, vision tower `model.visual`).
QWEN3_5 = Family("qwen3_5", ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), keep=(LINEAR_ATTN, MTP_FC),
                 fuse=QWEN3_5_FUSE)
QWEN_VL = Family("qwen2_5_vl", ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe"))
