"""DeepSeek's family rules: DeepSeek-V3 (and Kimi K2, its architecture), DeepSeek-V3.2 (MLA plus
the DSA indexer), Kimi K2.5 (K2 beside a vision tower) and DeepSeek-V4 (no vLLM model class yet).
GLM-5 shares MLA and the DSA indexer (glm.py imports them from here)."""

from __future__ import annotations

from tfcompile.families.family import Family, Keep

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

V3 = Family("deepseek_v3", ("deepseek_v3", "kimi_k2"), keep=(MLA_KV_B,), fuse=MLA_FUSE, modelopt=True)
# DeepSeek-V3.2 and GLM-5: MLA as V3 plus the DSA indexer; vLLM serves both with deepseek_v2.py
# (`DeepseekV2MLAAttention`, is_v32 when the config has index_topk).
V32 = Family("deepseek_v32", ("deepseek_v32",), keep=(MLA_KV_B, DSA_INDEXER), fuse=MLA_FUSE)
# Kimi K2.5: its text model is Kimi K2 (`language_model.model.*`, served by vLLM's DeepseekV2ForCausalLM
# inside kimi_k25.py), so the K2 rules plus the tower vLLM builds unquantized.
KIMI_K25 = Family("kimi_k25", ("kimi_k25",), keep=(MLA_KV_B, K25_TOWER), fuse=MLA_FUSE)
# DeepSeek-V4 (hyper-connections, compressed sparse attention, hash-routed MoE): vLLM 0.32 registers no
# model class for DeepseekV4ForCausalLM (only its chat parsers), so nothing here is read from an engine
# and the model is quantized by the conservative rules of a model type with none (its experts'
# w1/w2/w3 under `ffn`); its published FP8 / FP4 checkpoint is read (io/sources/deepseek_v4.py).
V4 = Family("deepseek_v4", ("deepseek_v4",), linears="standard", no_model=("vllm",))
