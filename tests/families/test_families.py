"""The tiny families have the real structure, and each family's selection rules hold (docs/models.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from families_util import CALIB, manifest, quantize, run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _names(src: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(src / "model.safetensors", framework="pt") as f:
        return set(f.keys())


def _layer_kinds(names: set[str], pattern: str) -> int:
    return len({m.group(1) for n in names if (m := re.search(pattern, n))})


@pytest.mark.parametrize("family", ["deepseek_v3", "kimi_k2", "gpt_oss", "glm4_moe", "qwen3", "qwen3_moe",
                                    "qwen3_next", "qwen2_5_vl"])
def test_tiny_model_has_the_real_structure(family, families, family_src):
    src = family_src(family)
    names = _names(src)
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["architectures"] == [families.FAMILIES[family].architecture]
    moe = _layer_kinds(names, r"layers\.(\d+)\.mlp\.experts\.")
    dense = _layer_kinds(names, r"layers\.(\d+)\.mlp\.gate_proj\.weight")
    if families.FAMILIES[family].moe:
        assert moe >= 2
        experts = {m.group(1) for n in names if (m := re.search(r"experts\.(\d+)\.", n))}
        n_exp = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
        assert n_exp >= 8 and (len(experts) >= 8 or any(n.endswith("experts.gate_up_proj") for n in names))
    else:
        assert moe == 0 and dense >= 2
    if family in ("deepseek_v3", "kimi_k2", "glm4_moe"):  # dense-first layers, then MoE + shared expert
        assert dense >= 2 and _layer_kinds(names, r"layers\.(\d+)\.mlp\.shared_experts\.") >= 2
        assert any(n.endswith("mlp.gate.e_score_correction_bias") for n in names)
    if family in ("deepseek_v3", "kimi_k2"):  # MLA
        for leaf in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "kv_a_layernorm"):
            assert _layer_kinds(names, rf"layers\.(\d+)\.self_attn\.{leaf}\.") == 4
    if family == "gpt_oss":
        assert _layer_kinds(names, r"layers\.(\d+)\.self_attn\.sinks") == 4
        assert cfg["layer_types"].count("sliding_attention") == 2 and cfg["layer_types"].count("full_attention") == 2
        assert {"model.layers.0.mlp.experts.gate_up_proj_bias", "model.layers.0.mlp.router.bias"} <= names
    if family == "qwen3_next":
        assert _layer_kinds(names, r"layers\.(\d+)\.linear_attn\.in_proj_qkvz") == 2
        assert _layer_kinds(names, r"layers\.(\d+)\.self_attn\.q_proj") == 2
        assert _layer_kinds(names, r"layers\.(\d+)\.mlp\.shared_expert_gate") == 4
    if family == "qwen2_5_vl":
        assert _layer_kinds(names, r"visual\.blocks\.(\d+)\.") == 2 and any("visual.merger" in n for n in names)


def _quantized(art) -> set[str]:
    return {x["module"] for x in manifest(art)["layers"]}


def test_deepseek_keeps_routers_and_kv_b_proj_and_fuses_the_latent_projections(family_artifact):
    art = family_artifact("deepseek_v3", "nvfp4a16")
    q, m = _quantized(art), manifest(art)
    assert not any(x.endswith(("mlp.gate", "kv_b_proj")) for x in q)
    assert {"model.layers.2.mlp.gate", "model.layers.0.self_attn.kv_b_proj"} <= set(m["ignore"])
    assert ["model.layers.0.self_attn.kv_a_proj_with_mqa", "model.layers.0.self_attn.q_a_proj"] in m["groups"]
    assert any(x.endswith("shared_experts.down_proj") for x in q) and any(".experts.7." in x for x in q)


def test_include_quantizes_a_kept_class_anyway(family_src, tmp_path):
    out = quantize(family_src("deepseek_v3"), tmp_path / "out", "nvfp4a16", "--set", 'select.include=["mla_kv_b"]')
    assert "model.layers.0.self_attn.kv_b_proj" in _quantized(out)
    code, _, err = run_cli("plan", "--format", "nvfp4", "--set", 'select.include=["visionn"]')
    assert code == 1 and "vision" in err  # a typo names the valid classes


def test_qwen3_next_keeps_linear_attention_and_the_shared_expert_gate(family_artifact):
    q = _quantized(family_artifact("qwen3_next", "nvfp4a16"))
    assert not any(".linear_attn." in x or x.endswith("shared_expert_gate") for x in q)
    assert any(x.endswith("shared_expert.gate_proj") for x in q) and any(".self_attn.q_proj" in x for x in q)


def test_vision_tower_stays_bf16_by_default_and_is_selectable(family_src, family_artifact, tmp_path):
    from families_util import tensors

    art = family_artifact("qwen2_5_vl", "fp8-dynamic")
    t = tensors(art)
    assert t["visual.blocks.0.attn.qkv.weight"].dtype == torch.bfloat16
    assert "visual.blocks.0.attn.qkv" in manifest(art)["ignore"]
    assert t["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    out = quantize(family_src("qwen2_5_vl"), tmp_path / "vision", "fp8-dynamic", "--set", 'select.include=["vision"]')
    tv = tensors(out)
    assert tv["visual.blocks.0.attn.qkv.weight"].dtype == torch.float8_e4m3fn
    assert tv["visual.merger.mlp.0.weight"].dtype == torch.bfloat16  # the merger is not a numbered block
    assert run_cli("verify", out)[0] == 0


def test_vision_language_calibration_reaches_every_lm_module(family_src, tmp_path):
    """transformers names the LM `model.language_model.layers...` in memory, the checkpoint
    `model.layers...`: calibration maps the names, so no module falls back (no silent scale)."""
    code, out, err = run_cli("quantize", family_src("qwen2_5_vl"), "-o", tmp_path / "out", "--format", "nvfp4",
                             *CALIB, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["passes"]["calibrate"]["fallback_modules"] == []
    assert doc["passes"]["calibrate"]["loop"] == "sequential"


def test_docs_table_lists_every_family_rule():
    from tfcompile.families import FAMILIES

    text = DOCS.read_text()
    for fam in FAMILIES:
        assert f"`{fam.name}`" in text, fam.name
        for keep in fam.keep:
            assert f"`select.include={keep.include}`" in text.replace('["', "").replace('"]', ""), keep.include
    assert "`select.include=vision`" in text.replace('["', "").replace('"]', "")
