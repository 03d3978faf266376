"""Multi-token-prediction layers are never dropped, and are written as vLLM's MTP loader reads them.

A tiny DeepSeek-V3 (4 decoder layers) gets one MTP layer in the published layout
(`model.layers.4.*`: a decoder layer + enorm, hnorm, eh_proj, shared_head.{norm,head}, embed_tokens;
config.json num_nextn_predict_layers=1), as DeepSeek-V3's `model.layers.61` is. What vLLM 0.32's
deepseek_mtp.py builds is the oracle (cited, not imported: vLLM is not installed here):
- `DeepSeekMultiTokenPredictorLayer.eh_proj = nn.Linear(2H, H)`: a plain bf16 `weight` [H, 2H];
- `SharedHead.head = ParallelLMHead(V, H)`: a bf16 `weight` [V, H] (no compressed-tensors scheme);
- enorm / hnorm / shared_head.norm: RMSNorm weights [H];
- `mtp_block = DeepseekV2DecoderLayer(vllm_config, prefix)` with the model's quant config: its
  Linears are quantized like every other decoder layer's (prefix `model.layers.4`, so the
  artifact's `ignore` names match).
Before this, checkpoint_check refused the layer as "unexpected tensors" (transformers declares only
`model.layers.61` ignorable), and a real layer 61 had eh_proj and shared_head.head packed to NVFP4.
"""

from __future__ import annotations

import json

import pytest
import torch

from families_util import CALIB, manifest, quantize, run_cli, tensors

MTP = "model.layers.4."
H, V = 64, 256


@pytest.fixture(scope="module")
def mtp_src(families, tmp_path_factory):
    src = families.make_tiny_deepseek_v3(tmp_path_factory.mktemp("mtp") / "src", topk_method="noaux_tc")
    return families.add_mtp_layer(src)


@pytest.mark.parametrize("fmt", ["nvfp4a16", "nvfp4", "fp8-dynamic"])
def test_mtp_layer_kept_with_the_names_shapes_and_dtypes_vllm_loads(mtp_src, tmp_path, fmt):
    src = tensors(mtp_src)
    assert sum(n.startswith(MTP) for n in src) > 40  # the whole MTP layer is in the checkpoint
    art = quantize(mtp_src, tmp_path / fmt, fmt, *(CALIB if fmt == "nvfp4" else ()))
    t, m = tensors(art), manifest(art)
    ignore = json.loads((art / "config.json").read_text())["quantization_config"]["ignore"]
    for name, shape in (("eh_proj", [H, 2 * H]), ("shared_head.head", [V, H])):  # nn.Linear, ParallelLMHead
        w = t[f"{MTP}{name}.weight"]
        assert list(w.shape) == shape and w.dtype == torch.bfloat16 and torch.equal(w, src[f"{MTP}{name}.weight"])
        assert f"{MTP}{name}" in ignore and not any(k.startswith(f"{MTP}{name}.weight_") for k in t)
    for name in ("enorm", "hnorm", "shared_head.norm", "embed_tokens"):
        assert torch.equal(t[f"{MTP}{name}.weight"], src[f"{MTP}{name}.weight"]), name
    quantized = {x["module"] for x in m["layers"]}
    kept = ("eh_proj", "shared_head.head", "embed_tokens", "self_attn.kv_b_proj", "mlp.gate")  # + norms
    block = [n[: -len(".weight")] for n in src if n.startswith(MTP) and n.endswith(".weight") and src[n].dim() == 2
             and "norm" not in n and n[len(MTP): -len(".weight")] not in kept]
    assert len(block) == 4 + 3 * 9 and set(block) <= quantized  # MLA projections, 8 experts + shared
    packed = "weight_packed" if fmt.startswith("nvfp4") else "weight"
    for mod in block:  # every MTP tensor is in the artifact under the checkpoint's name
        assert f"{mod}.{packed}" in t and t[f"{mod}.{packed}"].shape[0] == src[f"{mod}.weight"].shape[0]
    dropped = {n for n in src if n.startswith(MTP)} - set(t) - {f"{mod}.weight" for mod in block if packed != "weight"}
    assert not dropped
    assert run_cli("verify", art)[0] == 0


def test_an_undeclared_extra_layer_is_still_refused(families, tmp_path):
    """Only the MTP layers config.json declares are accepted: the same tensors with
    num_nextn_predict_layers removed are unexpected again (tfcompile never drops a tensor)."""
    src = families.add_mtp_layer(families.make_tiny_deepseek_v3(tmp_path / "src"))
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("num_nextn_predict_layers")
    (src / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "nvfp4a16", "-q")
    assert code == 1 and "unexpected" in err and "model.layers.4." in err


def test_glm4_moe_mtp_layer_same_layout(families, tmp_path):
    """GLM-4.5's MTP layer (`model.layers.92` on the published 92-layer model) has DeepSeek's layout
    (vLLM glm4_moe_mtp.py `Glm4MoeMultiTokenPredictorLayer`: eh_proj nn.Linear, shared_head ParallelLMHead)."""
    src = families.add_mtp_layer(families.make_tiny_glm4_moe(tmp_path / "src"))
    t = tensors(quantize(src, tmp_path / "out", "nvfp4a16"))
    assert t["model.layers.4.eh_proj.weight"].dtype == torch.bfloat16
    assert t["model.layers.4.shared_head.head.weight"].dtype == torch.bfloat16
    assert "model.layers.4.self_attn.q_proj.weight_packed" in t
    assert "model.layers.4.mlp.experts.7.up_proj.weight_packed" in t


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_mtp_kept_as_qwen3_5_mtp_loads_it(families, family, tmp_path):
    """vLLM qwen3_5_mtp.py `Qwen3_5MultiTokenPredictor`: `mtp.fc` (kept bf16, as the published
    releases store it), `mtp.layers.0` a full-attention decoder layer built with the quant config
    (quantized), `mtp.norm`, `mtp.pre_fc_norm_*`; top-level `mtp.` in both the causal LM and the
    vision-language checkpoint."""
    src = families.add_qwen3_5_mtp(families.FAMILIES[family].build(tmp_path / "src"))
    s = tensors(src)
    art = quantize(src, tmp_path / "out", "nvfp4a16")
    t = tensors(art)
    assert list(t["mtp.fc.weight"].shape) == [H, 2 * H] and torch.equal(t["mtp.fc.weight"], s["mtp.fc.weight"])
    assert "mtp.fc" in json.loads((art / "config.json").read_text())["quantization_config"]["ignore"]
    for norm in ("mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
        assert torch.equal(t[norm], s[norm])
    assert "mtp.layers.0.self_attn.q_proj.weight_packed" in t
    mtp_src = {n for n in s if n.startswith("mtp.")}
    packed = {f"{x['module']}.weight" for x in manifest(art)["layers"]}
    assert mtp_src - packed <= set(t) and len(mtp_src) > 12  # nothing of the MTP module dropped
    assert run_cli("verify", art)[0] == 0
