"""The 2026 families quantize as the engine serves them (vLLM's model code is the spec).

Each expectation names the vLLM class that decides it (vllm/model_executor/models/, 0.32):
- DeepSeek-V3.2 / GLM-5: deepseek_v2.py `Indexer` builds `wk_weights_proj` (wk + weights_proj)
  with quant_config=None, `wq_b` with the quant config; MLA's kv_b_proj as for V3;
  `DeepSeekV2FusedQkvAProjLinear` fuses q_a_proj + kv_a_proj_with_mqa.
- Qwen3.5: qwen3_5.py `packed_modules_mapping` loads in_proj_qkv + in_proj_z as `in_proj_qkvz` and
  in_proj_b + in_proj_a as `in_proj_ba` (one NVFP4 global scale each, when they are quantized).
- MiniMax-M2: minimax_m2.py `MiniMaxM2MoE`: the router `block_sparse_moe.gate` is a ReplicatedLinear
  with quant_config=None; experts w1/w3 are one fused GEMM.
The oracle is the checkpoint's own tensors (names, dtypes), not tfcompile's plan.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from families_util import manifest, quantize, run_cli, tensors

NEW = ("deepseek_v32", "glm_moe_dsa", "qwen3_5", "qwen3_5_moe", "minimax_m2")


def _names(src: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(src / "model.safetensors", framework="pt") as f:
        return set(f.keys())


def _kinds(names: set[str], pattern: str) -> int:
    return len({m.group(1) for n in names if (m := re.search(pattern, n))})


@pytest.mark.parametrize("family", NEW)
def test_tiny_2026_model_has_the_real_structure(family, families, family_src):
    src = family_src(family)
    names = _names(src)
    assert json.loads((src / "config.json").read_text())["architectures"] == [families.FAMILIES[family].architecture]
    if family in ("deepseek_v32", "glm_moe_dsa"):  # MLA + DSA indexer on every layer, dense first, then MoE
        for leaf in ("indexer.wq_b", "indexer.wk", "indexer.weights_proj", "indexer.k_norm", "kv_b_proj"):
            assert _kinds(names, rf"layers\.(\d+)\.self_attn\.{re.escape(leaf)}\.") == 3, leaf
        assert _kinds(names, r"layers\.(\d+)\.mlp\.experts\.7\.") == 2
    if family.startswith("qwen3_5"):  # 3:1 Gated DeltaNet : attention, split projections
        for leaf in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
            assert _kinds(names, rf"layers\.(\d+)\.linear_attn\.{leaf}\.") == 6, leaf
        assert _kinds(names, r"layers\.(\d+)\.self_attn\.q_proj\.") == 2
    if family == "qwen3_5_moe":
        assert any(n.startswith("model.visual.blocks.1.") for n in names)
        assert _kinds(names, r"layers\.(\d+)\.mlp\.shared_expert_gate\.") == 8
    if family == "minimax_m2":
        assert _kinds(names, r"layers\.(\d+)\.block_sparse_moe\.experts\.7\.w3\.") == 2
        assert _kinds(names, r"layers\.(\d+)\.block_sparse_moe\.e_score_correction_bias") == 2


def _packed(t: dict, module: str) -> bool:
    return f"{module}.weight_packed" in t


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_indexer_kept_as_vllm_builds_it(family, family_src, family_artifact):
    art = family_artifact(family, "nvfp4a16")
    t, m, src = tensors(art), manifest(art), tensors(family_src(family))
    for layer in range(3):
        p = f"model.layers.{layer}.self_attn"
        for kept in ("indexer.wk", "indexer.weights_proj", "kv_b_proj"):  # bf16 and listed: vLLM loads them dense
            assert torch.equal(t[f"{p}.{kept}.weight"], src[f"{p}.{kept}.weight"]), kept
            assert f"{p}.{kept}" in m["ignore"]
        for quantized in ("indexer.wq_b", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
            assert _packed(t, f"{p}.{quantized}"), quantized
        assert [f"{p}.kv_a_proj_with_mqa", f"{p}.q_a_proj"] in m["groups"]  # vLLM's fused_qkv_a_proj
        assert torch.equal(t[f"{p}.q_a_proj.weight_global_scale"], t[f"{p}.kv_a_proj_with_mqa.weight_global_scale"])
    assert m["family"] == family
    cfg = json.loads((art / "config.json").read_text())["quantization_config"]
    assert "model.layers.0.self_attn.indexer.wk" in cfg["ignore"]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_keeps_gated_deltanet_and_the_vision_tower(family, family_src, family_artifact):
    art = family_artifact(family, "nvfp4a16")
    t, src = tensors(art), tensors(family_src(family))
    lin = [n for n in src if ".linear_attn." in n and n.endswith(".weight") and src[n].dim() == 2]
    assert len(lin) == 30 and all(torch.equal(t[n], src[n]) for n in lin)
    assert not any(".linear_attn." in x["module"] for x in manifest(art)["layers"])
    attn = [n for n in src if ".self_attn.q_proj.weight" in n]
    assert attn and all(_packed(t, n[: -len(".weight")]) for n in attn)
    if family == "qwen3_5_moe":
        vis = [n for n in src if n.startswith("model.visual.") and n.endswith(".weight")]
        assert vis and all(torch.equal(t[n], src[n]) for n in vis)
        assert any(_packed(t, n[: -len(".weight")]) for n in src if ".mlp.experts.7.up_proj" in n)


def test_qwen3_5_linear_attention_quantized_shares_one_scale_per_vllm_fused_layer(family_src, tmp_path):
    art = quantize(family_src("qwen3_5"), tmp_path / "la", "nvfp4a16", "--set", 'select.include=["linear_attn"]')
    t, groups = tensors(art), manifest(art)["groups"]
    p = "model.layers.0.linear_attn"
    assert [f"{p}.in_proj_qkv", f"{p}.in_proj_z"] in groups and [f"{p}.in_proj_a", f"{p}.in_proj_b"] in groups
    for a, b in (("in_proj_qkv", "in_proj_z"), ("in_proj_b", "in_proj_a")):  # in_proj_qkvz, in_proj_ba
        assert torch.equal(t[f"{p}.{a}.weight_global_scale"], t[f"{p}.{b}.weight_global_scale"])
    assert run_cli("verify", art)[0] == 0


def test_minimax_m2_keeps_its_router_and_fuses_w1_w3(family_src, family_artifact):
    art = family_artifact("minimax_m2", "nvfp4a16")
    t, m, src = tensors(art), manifest(art), tensors(family_src("minimax_m2"))
    moe = "model.layers.1.block_sparse_moe"
    assert torch.equal(t[f"{moe}.gate.weight"], src[f"{moe}.gate.weight"]) and f"{moe}.gate" in m["ignore"]
    assert torch.equal(t[f"{moe}.e_score_correction_bias"], src[f"{moe}.e_score_correction_bias"])
    assert [f"{moe}.experts.3.w1", f"{moe}.experts.3.w3"] in m["groups"]
    assert all(_packed(t, f"{moe}.experts.{e}.{w}") for e in range(8) for w in ("w1", "w2", "w3"))
    assert m["family"] == "minimax_m2"


# Full-size configs (transformers 5.24's config-class defaults, which are the published models'; the
# published MTP layer counts added): `plan --estimate` plans them from config.json alone, with the
# engines' verdict on fp8-block at TP 8 (tfcompile/artifact/engines.py): DeepSeek-V3.2 / GLM-5 serve
# (MLA's q_a/kv_a and the indexer's wq_b are replicated by vLLM, not split); MiniMax-M2's experts
# (1536 / 8 = 192) and Qwen3.5-35B-A3B's (512 / 8 = 64) do not split into 128-blocks: vLLM serves
# them at TP 4 / TP 2, or with expert parallelism. Kimi K2.5: the K2 language model (384 experts of 2048,
# 16 rows of 128 per rank at TP 8) beside its MoonViT tower, as DeepSeek-V3 serves.
@pytest.mark.parametrize("name,params_b,vllm_tp8", [("deepseek-v3.2", 671.9, None), ("glm-5", 743.9, None),
                                                    ("qwen3.5-35b-a3b", 35.1, "per partition = 64 "),
                                                    ("minimax-m2", 228.7, "per partition = 192 "),
                                                    ("kimi-k2.5", 1026.9, None)])
def test_full_size_configs_estimate_with_the_engines_verdict(name, params_b, vllm_tp8):
    cfg = Path(__file__).resolve().parents[2] / "examples" / "configs" / name
    code, out, err = run_cli("plan", "--format", "fp8-block", "--estimate", cfg, "--json",
                             "--set", "verify.engine_tp=8")
    assert code == 0, err
    doc = json.loads(out)
    assert round(doc["model"]["params"] / 1e9, 1) == params_b
    assert 0.45 < doc["output_bytes"] / (doc["model"]["source_gb"] * 1e9) < 0.55  # FP8: ~8 of 16 bits
    vllm = doc["engines"]["vllm"]
    if vllm_tp8 is None:
        assert vllm == {"verdict": "serves it as written", "problems": []}
    else:
        assert vllm["verdict"] == "refuses" and vllm_tp8 in vllm["problems"][0]["message"]


def test_minimax_m2_experts_are_calibrated_under_their_checkpoint_names(family_src, tmp_path):
    """MiniMax-M2 stores experts as w1/w2/w3; transformers fuses them (its WeightConverters: w1 + w3 ->
    gate_up_proj, w2 -> down_proj). Before, calibration recorded the routed inputs under the in-memory
    names (`mlp.experts.0.gate_proj`) that no quantized module had, so every expert silently took the
    fallback amax. Now each expert's own input amax, and its routed tokens under the checkpoint's names."""
    code, out, err = run_cli("quantize", family_src("minimax_m2"), "-o", tmp_path / "out", "--format", "nvfp4",
                             "--calib", "random", "--calib-samples", "4", "--calib-seq-len", "64", "--json")
    assert code == 0, err
    calib, m = json.loads(out)["passes"]["calibrate"], manifest(tmp_path / "out")
    tokens = m["moe"]["expert_tokens"]
    assert sorted(tokens) == [f"model.layers.{i}.block_sparse_moe.experts" for i in range(2)]
    assert sum(map(sum, tokens.values())) == 2 * 2 * 4 * 64  # top-2 of every token, both layers
    assert calib["fallback_modules"] == [f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}"
                                         for i, c in enumerate(tokens.values()) for e in range(8) if c[e] < 16
                                         for w in ("w1", "w2", "w3")]
    t = tensors(tmp_path / "out")
    scales = {t[f"model.layers.0.block_sparse_moe.experts.{e}.w1.input_global_scale"].item() for e in range(8)}
    assert len(scales) > 1  # each expert's own routed inputs
