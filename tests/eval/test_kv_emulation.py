"""FP8 KV-cache emulation in `tfcompile eval`: the K/V attention sees, the scales used, --kv-cache off.

The oracle for every emulated K/V is computed here, independently of
tfcompile: the raw post-RoPE K (captured by wrapping transformers'
`apply_rotary_pos_emb`) and V (the v_proj output, reshaped to heads), the
scales read from the artifact's safetensors, and torch's float8_e4m3fn round
trip `clamp(x / s, -448, 448).to(float8_e4m3fn).float() * s`.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests_helpers import tensors

SMALL = ("--max-tokens", "256", "--seq-len", "64", "--batch-size", "4")
KV_CALIB = ("--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32")


def oracle(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """torch's own FP8 E4M3 round trip (round-to-nearest-even; clamped first so it saturates)."""
    s = s.float()
    return ((x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s).to(x.dtype)


@pytest.fixture(scope="module")
def kv_artifact(tiny_llama_src, tmp_path_factory):
    """kv_artifact("tensor" | "attn_head" | None) -> the tiny Llama as fp8-dynamic, with that KV cache."""
    from tfcompile.cli.main import main

    root, cache = tmp_path_factory.mktemp("kv-artifacts"), {}

    def get(strategy):
        if strategy not in cache:
            out = root / str(strategy)
            extra = {None: [], "tensor": ["--kv-cache", "fp8", *KV_CALIB],
                     "attn_head": ["--kv-cache", "fp8", "--kv-per-head", *KV_CALIB]}[strategy]
            assert main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", "fp8-dynamic",
                         "-q", *extra]) == 0
            cache[strategy] = out
        return cache[strategy]

    return get


def test_fake_quant_is_the_float8_round_trip():
    from tfcompile.evaluate.kvcache import fake_quant_fp8

    x = torch.randn(2, 3, 17, 8) * 40  # (B, H_kv, S, D); some values saturate at 448 * scale
    for s in (torch.tensor([0.05]), torch.tensor([0.02, 0.1, 0.5]).reshape(3, 1, 1)):
        got = fake_quant_fp8(x, s)
        assert got.dtype == x.dtype and got.shape == x.shape
        assert torch.equal(got, oracle(x, s))
        assert (got.abs() <= 448 * s).all()  # saturated, never NaN
        assert not torch.equal(got, x)
    xb = x.to(torch.bfloat16)
    assert torch.equal(fake_quant_fp8(xb, torch.tensor([0.05])), oracle(xb, torch.tensor([0.05])))


def _capture(model, monkeypatch):
    """Raw post-RoPE K and V per layer (independent hooks) and what SDPA actually receives."""
    from transformers.integrations import sdpa_attention
    from transformers.models.llama import modeling_llama

    raw_k, raw_v, seen, cur = {}, {}, {}, {"layer": None}
    real_rope, real_sdpa = modeling_llama.apply_rotary_pos_emb, sdpa_attention.sdpa_attention_forward

    def rope(q, k, cos, sin, *a, **kw):
        q2, k2 = real_rope(q, k, cos, sin, *a, **kw)
        raw_k[cur["layer"]] = k2.detach().clone()
        return q2, k2

    def sdpa(module, query, key, value, attention_mask, **kw):
        seen[cur["layer"]] = (key.detach().clone(), value.detach().clone())
        return real_sdpa(module, query, key, value, attention_mask, **kw)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", rope)
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", sdpa)
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        attn.register_forward_pre_hook(lambda m, a, i=i: cur.update(layer=i))

        def v_hook(m, a, out, i=i, hd=attn.head_dim):  # (B, S, H_kv * D) -> (B, H_kv, S, D)
            raw_v[i] = out.detach().reshape(*out.shape[:2], -1, hd).transpose(1, 2).clone()
        attn.v_proj.register_forward_hook(v_hook)
    return raw_k, raw_v, seen


@pytest.mark.parametrize("strategy", ["tensor", "attn_head"])
def test_attention_sees_fp8_kv_with_the_artifacts_scales(kv_artifact, strategy, monkeypatch):
    from tfcompile.evaluate.models import load_candidate

    art = kv_artifact(strategy)
    cand = load_candidate(art, torch.float32)
    assert cand.kv is not None and cand.kv.strategy == strategy
    raw_k, raw_v, seen = _capture(cand.model, monkeypatch)
    ids = torch.randint(4, 256, (2, 24))
    with torch.inference_mode():
        cand.model(input_ids=ids)
    t = tensors(art)  # the scales as stored (bf16), read independently of tfcompile
    assert sorted(seen) == sorted(raw_k) == sorted(raw_v) == [0, 1]
    for i in range(2):
        ks, vs = t[f"model.layers.{i}.self_attn.k_scale"], t[f"model.layers.{i}.self_attn.v_scale"]
        assert ks.shape == vs.shape == ((1,) if strategy == "tensor" else (2, 1, 1))
        k, v = seen[i]
        assert k.shape == raw_k[i].shape == (2, 2, 24, 32) and v.shape == raw_v[i].shape
        assert torch.equal(k, oracle(raw_k[i], ks)) and torch.equal(v, oracle(raw_v[i], vs))
        assert not torch.equal(k, raw_k[i]) and not torch.equal(v, raw_v[i])  # it did quantize
        assert not torch.equal(k, oracle(raw_k[i], ks * 2))  # other scales would give other K
    assert cand.kv.calls == {"model.layers.0.self_attn": 1, "model.layers.1.self_attn": 1}


def _eval(run_cli, model, reference, text, *extra):
    r = run_cli("eval", model, "--reference", reference, "--text", text, *SMALL, "--json", *extra)
    assert r.code == 0, r.err
    return r.json()


def test_eval_cli_reports_kv_emulation(run_cli, kv_artifact, tiny_llama, eval_text, monkeypatch):
    doc = _eval(run_cli, kv_artifact("attn_head"), tiny_llama, eval_text)
    assert doc["kv_cache"] == {"mode": "auto", "emulated": True, "dtype": "fp8_e4m3", "strategy": "attn_head",
                               "modules": 2, "attention_calls": 2}  # 1 batch of 4 x 64, 2 layers
    assert 0 < doc["metrics"]["kl_mean"] < 0.05 and doc["warnings"] == []
    monkeypatch.setenv("NO_COLOR", "1")
    r = run_cli("eval", kv_artifact("tensor"), "--reference", tiny_llama, "--text", eval_text, *SMALL)
    assert r.code == 0 and r.out == ""
    assert "KV cache" in r.err and "fp8_e4m3 per tensor, emulated (2 attention modules)" in r.err
    plain = _eval(run_cli, kv_artifact(None), tiny_llama, eval_text)
    assert plain["kv_cache"]["emulated"] is False and plain["kv_cache"]["dtype"] is None
    ref = _eval(run_cli, tiny_llama, tiny_llama, eval_text)
    assert ref["kv_cache"] == {"mode": "auto", "emulated": False, "dtype": None, "strategy": None,
                               "modules": 0, "attention_calls": 0}


def test_kv_cache_off_is_the_unemulated_result(run_cli, kv_artifact, tiny_llama, eval_text):
    """Same fp8-dynamic weights with and without KV scales: off == the artifact without a KV cache."""
    auto = _eval(run_cli, kv_artifact("tensor"), tiny_llama, eval_text)
    off = _eval(run_cli, kv_artifact("tensor"), tiny_llama, eval_text, "--kv-cache", "off")
    plain = _eval(run_cli, kv_artifact(None), tiny_llama, eval_text)
    assert off["metrics"] == plain["metrics"] and off["layers"] == plain["layers"]
    assert auto["metrics"] != off["metrics"]
    assert off["kv_cache"] == {"mode": "off", "emulated": False, "dtype": "fp8_e4m3", "strategy": "tensor",
                               "modules": 2, "attention_calls": 0}


def _rewrite_scale(art, tmp_path, name, value):
    import shutil

    dst = tmp_path / "tampered"
    shutil.copytree(art, dst)
    f = dst / "model.safetensors"
    t = load_file(f)
    t[name] = torch.full_like(t[name], value)
    save_file(t, f, metadata={"format": "pt"})
    return dst


def test_scales_come_from_the_artifact(run_cli, kv_artifact, tiny_llama, eval_text, tmp_path):
    art = kv_artifact("tensor")
    base = _eval(run_cli, art, tiny_llama, eval_text)
    # FP8 is floating point: a scale moves where V saturates (448 * scale), not its relative step
    coarse = _rewrite_scale(art, tmp_path, "model.layers.0.self_attn.v_scale", 1e-4)  # |V| <= 0.0448
    worse = _eval(run_cli, coarse, tiny_llama, eval_text, "--no-verify")  # edited on purpose: skip the checksums
    assert worse["metrics"]["kl_mean"] > 2 * base["metrics"]["kl_mean"]
    off = _eval(run_cli, coarse, tiny_llama, eval_text, "--no-verify", "--kv-cache", "off")  # ignores the scales
    assert off["metrics"] == _eval(run_cli, kv_artifact(None), tiny_llama, eval_text)["metrics"]


def test_bad_kv_scales_are_user_errors(run_cli, kv_artifact, tiny_llama, eval_text, tmp_path):
    bad = _rewrite_scale(kv_artifact("tensor"), tmp_path, "model.layers.1.self_attn.v_scale", 0.0)
    r = run_cli("eval", bad, "--reference", tiny_llama, "--text", eval_text, *SMALL)
    assert r.code == 1 and "checksums" in r.err  # eval checks the artifact's files first
    r = run_cli("eval", bad, "--reference", tiny_llama, "--text", eval_text, *SMALL, "--no-verify")
    assert r.code == 1 and "v_scale" in r.err and "non-positive" in r.err and "hint:" in r.err
    cfg_path = bad / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"]["kv_cache_scheme"]["num_bits"] = 4
    cfg_path.write_text(json.dumps(cfg))
    r = run_cli("eval", bad, "--reference", tiny_llama, "--text", eval_text, *SMALL, "--no-verify")
    assert r.code == 1 and "kv_cache_scheme" in r.err and "--kv-cache off" in r.err
    r = run_cli("eval", bad, "--reference", tiny_llama, "--text", eval_text, "--kv-cache", "fp16")
    assert r.code == 2  # not a choice: usage error


def nvfp4_oracle(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """NVFP4 through ml_dtypes, from the rule: global multiplier g = 6 / s (s = amax / 448), per
    16 values along head_dim a block scale e4m3(amax_b / 6 * g) (0 -> 1), elements e2m1(x / (s_b / g))."""
    import ml_dtypes
    import numpy as np

    g = np.float32(6.0) / np.float32(float(s))
    xb = x.float().numpy().reshape(*x.shape[:-1], -1, 16)
    sb = (np.abs(xb).max(-1) / np.float32(6.0) * g).astype(np.float32)
    sb = sb.clip(-448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    sb = np.where(sb == 0, np.float32(1.0), sb)
    mult = (sb / g)[..., None]
    vals = (xb / mult).clip(-6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return torch.from_numpy((vals * mult).reshape(x.shape)).to(x.dtype)


def test_fake_quant_nvfp4_is_the_ml_dtypes_rule():
    from tfcompile.evaluate.kvcache import fake_quant_nvfp4

    x = torch.randn(2, 3, 17, 64) * 5
    s = torch.tensor([float(x.abs().max()) / 448])
    got = fake_quant_nvfp4(x, s)
    assert got.shape == x.shape and torch.equal(got, nvfp4_oracle(x, s))
    assert not torch.equal(got, x) and float((got - x).pow(2).mean() / x.pow(2).mean()) < 0.02


def test_attention_sees_nvfp4_kv_and_the_artifact_says_so(tiny_llama_src, tmp_path, monkeypatch, run_cli):
    """--kv-cache nvfp4: the same calibrated k_scale/v_scale (amax / 448), compressed-tensors'
    NVFP4 arguments as kv_cache_scheme, modelopt's kv_cache_quant_algo NVFP4, and eval emulates
    NVFP4 K/V."""
    from tfcompile.artifact.ct_presets import CONFIG_GROUP
    from tfcompile.evaluate.models import load_candidate

    out = tmp_path / "nvfp4kv"
    res = run_cli("quantize", tiny_llama_src, "-o", out, "--format", "fp8-dynamic", "--kv-cache", "nvfp4",
                  "--export", "modelopt", "-q", *KV_CALIB)
    assert res.code == 0, res.err
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"] == CONFIG_GROUP["NVFP4"]["input_activations"]
    hf = json.loads((out / "modelopt" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["kv_cache_quant_algo"] == "NVFP4"
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    assert manifest["scheme"]["kv_cache"] == {"dtype": "nvfp4", "strategy": "tensor"}
    cand = load_candidate(out, torch.float32)
    raw_k, raw_v, seen = _capture(cand.model, monkeypatch)
    with torch.inference_mode():
        cand.model(input_ids=torch.randint(4, 256, (2, 24)))
    t = tensors(out)
    for i in range(2):
        ks, vs = t[f"model.layers.{i}.self_attn.k_scale"], t[f"model.layers.{i}.self_attn.v_scale"]
        k, v = seen[i]
        assert torch.equal(k, nvfp4_oracle(raw_k[i], ks)) and torch.equal(v, nvfp4_oracle(raw_v[i], vs))
    assert cand.kv.report("auto")["dtype"] == "nvfp4"
    assert run_cli("verify", out).code == 0
    res = run_cli("plan", "--format", "nvfp4a16", "--kv-cache", "nvfp4", "--kv-per-head")
    assert res.code == 1 and "--kv-per-head" in res.err and "hint:" in res.err
