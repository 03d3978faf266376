"""Kimi K2.5 (`Kimi_K25ForConditionalGeneration`) as published and as vLLM serves it.

vLLM 0.32's kimi_k25.py is the spec: `KimiK25ForConditionalGeneration` builds the Kimi K2 language
model as `DeepseekV2ForCausalLM` under `language_model` (the published `language_model.model.layers.N`)
and, for a compressed-tensors checkpoint, the MoonViT `vision_tower` and the `mm_projector` with
quant_config=None (`_maybe_ignore_quant_config`). The published checkpoint stores the routed experts
INT4 pack-quantized (compressed-tensors), read as they are (tfcompile/io/sources/int4_pack.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from families_util import CALIB, EVAL_GAPS, ct_load, dequantized_reference, manifest, quantize, run_cli, tensors, \
    weight_mismatches

LM = "language_model.model.layers"


def test_tiny_kimi_k25_has_the_published_names(families, family_src):
    src = family_src("kimi_k25")
    names = set(tensors(src))
    # the published class name (vLLM's registry key), not transformers' own: read through io.hf_config.ARCH_ALIASES
    assert json.loads((src / "config.json").read_text())["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert {f"{LM}.0.self_attn.kv_b_proj.weight", f"{LM}.3.mlp.experts.7.down_proj.weight",
            "language_model.lm_head.weight", "vision_tower.encoder.blocks.1.wqkv.weight",
            "vision_tower.encoder.blocks.1.mlp.fc0.weight", "mm_projector.proj.2.weight",
            "mm_projector.pre_norm.weight"} <= names
    assert not any(".blocks." in n for n in names if n.startswith("language_model."))  # transformers' save
    assert not any(n.startswith("model.") for n in names)


def test_kimi_k25_quantizes_the_k2_language_model_and_keeps_the_tower(family_src, family_artifact):
    art = family_artifact("kimi_k25", "nvfp4a16")
    t, m, src = tensors(art), manifest(art), tensors(family_src("kimi_k25"))
    assert m["family"] == "kimi_k25"
    tower = [n for n in src if n.startswith(("vision_tower.", "mm_projector."))]
    assert len(tower) > 20 and all(torch.equal(t[n], src[n]) for n in tower)
    assert {"vision_tower.encoder.blocks.0.wqkv", "mm_projector.proj.0"} <= set(m["ignore"])
    p = f"{LM}.0.self_attn"
    assert torch.equal(t[f"{p}.kv_b_proj.weight"], src[f"{p}.kv_b_proj.weight"])  # MLA, as Kimi K2
    for q in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
        assert f"{p}.{q}.weight_packed" in t, q
    assert [f"{p}.kv_a_proj_with_mqa", f"{p}.q_a_proj"] in m["groups"]  # vLLM's fused_qkv_a_proj
    assert all(f"{LM}.{i}.mlp.experts.{e}.{w}.weight_packed" in t for i in (2, 3) for e in range(8)
               for w in ("gate_proj", "up_proj", "down_proj"))
    assert torch.equal(t[f"{LM}.2.mlp.gate.weight"], src[f"{LM}.2.mlp.gate.weight"])
    assert {x["module"] for x in m["layers"]} == {n[: -len(".weight_packed")] for n in t if n.endswith("weight_packed")}
    assert run_cli("verify", art, "--engine", "vllm")[0] == 0


def test_kimi_k25_calibration_reaches_every_language_model_module(family_src, tmp_path):
    """The published names (`language_model.model.layers.N`) are not transformers' in-memory ones
    (`model.language_model.layers.N`): calibration maps them, so only experts no token reached fall back."""
    code, out, err = run_cli("quantize", family_src("kimi_k25"), "-o", tmp_path / "out", "--format", "nvfp4",
                             *CALIB, "--json")
    assert code == 0, err
    fallback = json.loads(out)["passes"]["calibrate"]["fallback_modules"]
    assert [f for f in fallback if not re.search(r"\.mlp\.experts\.\d+\.", f)] == []


def test_kimi_k25_transformers_load_equals_our_dequantized_weights(family_src, family_artifact):
    """transformers 5.25 + compressed-tensors reads the artifact (published names, renamed at load)
    with exactly the weights tfcompile's own decoder gives (fp8-dynamic: no MoE loader defect)."""
    src, art = family_src("kimi_k25"), family_artifact("kimi_k25", "fp8-dynamic")
    loaded, ref = ct_load(art), dequantized_reference(src, art)
    assert weight_mismatches(loaded, ref) == []
    w = dict(loaded.named_parameters())
    assert w["model.language_model.layers.2.mlp.experts.gate_up_proj"].dtype == torch.bfloat16


def test_kimi_k25_published_int4_experts_are_read_as_they_are(family_src, published, tmp_path):
    src = published.to_int4_pack_quantized(family_src("kimi_k25"), tmp_path / "int4")
    bf16 = published.dequantize_compressed(src, tmp_path / "bf16")
    a, b = quantize(src, tmp_path / "a", "nvfp4"), quantize(bf16, tmp_path / "b", "nvfp4")
    for f in ("model.safetensors", "config.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    rec = manifest(a)["source"]["format"]
    assert rec["compression"] == "pack-quantized" and rec["dequantized_tensors"] == 3 * 8 * 2  # 2 MoE layers


def test_kimi_k25_tower_quantized_anyway_is_refused_for_vllm(family_src, tmp_path):
    art = quantize(family_src("kimi_k25"), tmp_path / "vision", "fp8-dynamic", "--set", 'select.include=["vision"]')
    assert tensors(art)["vision_tower.encoder.blocks.0.wqkv.weight"].dtype == torch.float8_e4m3fn
    code, _, err = run_cli("verify", art, "--engine", "vllm")
    assert code == 1 and "vision_tower" in err and "hint:" in err, err


@pytest.mark.xfail(strict=True, reason="known gap (docs/models.md): " + EVAL_GAPS["kimi_k25"])
def test_kimi_k25_eval_builds_the_artifact(family_src, family_artifact):
    code, _, err = run_cli("eval", family_artifact("kimi_k25", "fp8-dynamic"), "--reference", family_src("kimi_k25"),
                           "--max-tokens", "64", "--seq-len", "32", "--json")
    assert code == 0, err
