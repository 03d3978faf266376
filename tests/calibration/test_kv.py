"""FP8 KV-cache scales: post-RoPE max|K| and max|V| / 448, where vLLM and modelopt read them."""

from __future__ import annotations

import json

import torch

from tests_helpers import tensors


def _oracle_amax(model_dir, ids):
    """max|K| (after RoPE, as cached) and max|V| per layer, captured independently of
    tfcompile's AttentionInterface observer: by wrapping apply_rotary_pos_emb and v_proj."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    ks, vs, cur = {}, {}, {"layer": None}
    real_rope = modeling_llama.apply_rotary_pos_emb

    def rope(q, k, cos, sin, *a, **kw):
        q2, k2 = real_rope(q, k, cos, sin, *a, **kw)
        i = cur["layer"]
        ks[i] = max(ks.get(i, 0.0), k2.abs().float().max().item())
        return q2, k2

    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_pre_hook(lambda m, a, kw=None, i=i: cur.update(layer=i)))
        hooks.append(layer.self_attn.v_proj.register_forward_hook(
            lambda m, a, out, i=i: vs.__setitem__(i, max(vs.get(i, 0.0), out.abs().float().max().item()))))
    modeling_llama.apply_rotary_pos_emb = rope
    try:
        with torch.inference_mode():
            for row in ids:
                model(input_ids=row[None])
    finally:
        modeling_llama.apply_rotary_pos_emb = real_rope
        for h in hooks:
            h.remove()
    return ks, vs


def _round_up_bf16(x: float) -> float:
    s = torch.tensor([x]).to(torch.bfloat16)
    if s.float().item() < x:
        s = torch.nextafter(s, torch.tensor([float("inf")], dtype=torch.bfloat16))
    return s.float().item()


def test_kv_scales_match_post_rope_amax(tiny_llama, tmp_path, run_cli):
    from tfcompile.calibration.datasets import calibration_tokens

    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--kv-cache", "fp8",
                  "--calib", "random", "--calib-samples", "3", "--calib-seq-len", "32", "--export", "modelopt",
                  # the oracle runs the model in bf16; `auto` computes in float32 on a CPU without native
                  # bf16 (an AVX2-only one), which moves max|K| by an ulp there
                  "--set", "calibrate.dtype=bfloat16")
    assert res.code == 0, res.err
    ids = calibration_tokens("random", None, samples=3, seq_len=32, seed=0, vocab=256)
    ks, vs = _oracle_amax(tiny_llama, ids)
    t, mo = tensors(out), tensors(out / "modelopt")
    for i in range(2):
        a = f"model.layers.{i}.self_attn"
        assert t[f"{a}.k_scale"].shape == (1,) and t[f"{a}.k_scale"].dtype == torch.bfloat16
        assert t[f"{a}.k_scale"].item() == _round_up_bf16(ks[i] / 448)
        assert t[f"{a}.v_scale"].item() == _round_up_bf16(vs[i] / 448)
        assert mo[f"{a}.k_proj.k_scale"].shape == () and mo[f"{a}.k_proj.k_scale"].item() == t[f"{a}.k_scale"].item()
        assert mo[f"{a}.v_proj.v_scale"].item() == t[f"{a}.v_scale"].item()
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["kv_cache_scheme"]["strategy"] == "tensor" and cfg["kv_cache_scheme"]["num_bits"] == 8
    hf = json.loads((out / "modelopt" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert run_cli("verify", out).code == 0


def test_per_head_scales_and_transformers_loads_them(tiny_llama, tmp_path, run_cli):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "--kv-cache", "fp8",
                  "--kv-per-head", "--calib-samples", "2", "--calib-seq-len", "16")
    assert res.code == 0, res.err
    t = tensors(out)
    k = t["model.layers.0.self_attn.k_scale"]
    assert k.shape == (2, 1, 1) and bool((k > 0).all())  # 2 KV heads in the tiny Llama
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["kv_cache_scheme"]["strategy"] == "attn_head"
    # transformers 5.24 + compressed-tensors 0.20 do not attach KV scales to attention (their
    # detection looks for a forward argument transformers 5 renamed): the artifact must still
    # load, with k_scale/v_scale reported as unused keys. vLLM reads them (docs/interop.md).
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model(torch.tensor([[1, 5, 9]])).logits.isfinite().all()


def test_kv_cache_adds_calibration_to_weight_only_presets(tiny_llama, tmp_path, run_cli):
    from tfcompile.recipe.build import build_recipe

    names = build_recipe(fmt="mxfp4a16", overrides={"calibrate": {"kv_cache": "fp8"}}).names()
    assert names == ("load", "select", "calibrate", "quantize", "pack", "manifest", "verify")
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8", "--set", "calibrate.kv_cache=int4")
    assert res.code == 1 and "kv_cache 'int4'" in res.err and not out.exists()
