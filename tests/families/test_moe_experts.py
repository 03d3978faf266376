"""MoE done right: per-expert calibration, the fallback policy, GPTQ per expert, fused experts split exactly.

The peers' worst MoE bugs, each made impossible here and tested: experts no calibration token
reached getting NaN / zero global scales (llm-compressor #2826), GPTQ on fused experts destroying
accuracy (#2939), fused expert layouts read the wrong way round.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from families_util import ids, manifest, model_class, quantize, run_cli, tensors

MOE = ("deepseek_v3", "kimi_k2", "gpt_oss", "glm4_moe", "qwen3_moe", "qwen3_next")
ONE_SAMPLE = ("--calib", "random", "--calib-samples", "1", "--calib-seq-len", "8")


def _scales_ok(t: dict[str, torch.Tensor]) -> list[str]:
    """Names of scale tensors that are NaN, Inf, zero or negative (E8M0: the NaN code 0xFF)."""
    bad = []
    for name, v in t.items():
        if not name.endswith(("_scale", "_global_scale", "scale_2")):
            continue
        if v.dtype == torch.uint8:
            bad += [name] if bool((v == 255).any()) else []
        elif not bool(torch.isfinite(v.float()).all()) or not bool((v.float() > 0).all()):
            bad.append(name)
    return bad


@pytest.mark.parametrize("family", MOE)
def test_one_calibration_sample_gives_no_nan_inf_or_zero_scale(family, family_src, tmp_path):
    out = quantize(family_src(family), tmp_path / "out", "nvfp4", "--kv-cache", "fp8", *ONE_SAMPLE)
    t = tensors(out)
    assert _scales_ok(t) == []
    assert any(k.endswith("experts.0.down_proj.input_global_scale") for k in t)  # the W4A4 input scales exist
    moe = manifest(out)["moe"]
    assert moe["below_min_tokens"]  # 8 tokens x top-2 over 8 experts: most experts saw (almost) nothing
    for counts in moe["expert_tokens"].values():
        assert len(counts) == 8 and sum(counts) == 8 * 2  # every routed token counted, once per top-k slot
    assert run_cli("verify", out)[0] == 0


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss"])
def test_fp8_static_with_one_sample(family, family_src, tmp_path):
    t = tensors(quantize(family_src(family), tmp_path / "out", "fp8", *ONE_SAMPLE))
    assert _scales_ok(t) == [] and any(k.endswith("down_proj.input_scale") for k in t)


def test_fallback_policy_takes_the_layer_max_over_experts_and_never_invents_one():
    from tfcompile.calibration.moe_policy import resolve_amax
    from tfcompile.errors import CheckpointError

    p = "model.layers.1.mlp.experts"
    mods = {f"{p}.{e}.{x}" for e in range(3) for x in ("gate_proj", "up_proj", "down_proj")} | \
        {"model.layers.1.self_attn.q_proj"}
    amax = {f"{p}.0.gate_proj": 2.0, f"{p}.0.up_proj": 2.0, f"{p}.0.down_proj": 5.0,
            f"{p}.1.gate_proj": 3.0, f"{p}.1.up_proj": 3.0, f"{p}.1.down_proj": 1.0,
            "model.layers.1.self_attn.q_proj": 9.0}
    tokens = {f"{p}.0": 40, f"{p}.1": 3, f"{p}.2": 0}
    out, fallback = resolve_amax(mods, amax, tokens, 16)
    assert out[f"{p}.0.gate_proj"] == 2.0  # enough tokens: its own
    assert out[f"{p}.1.gate_proj"] == 3.0 and out[f"{p}.1.down_proj"] == 5.0  # 3 tokens: max over experts
    assert out[f"{p}.2.up_proj"] == 3.0 and out[f"{p}.2.down_proj"] == 5.0  # none: the same, per projection
    assert set(fallback) == {f"{p}.{e}.{x}" for e in (1, 2) for x in ("gate_proj", "up_proj", "down_proj")}
    assert all(v > 0 for v in out.values())
    with pytest.raises(CheckpointError, match="no calibration token reached"):
        resolve_amax(mods, {}, tokens, 16)


def test_calib_all_experts_covers_every_expert_and_leaves_routing_unchanged(family_src, tmp_path):
    src = family_src("qwen3_moe")
    a = quantize(src, tmp_path / "routed", "nvfp4", *ONE_SAMPLE)
    code, _, err = run_cli("quantize", src, "-o", tmp_path / "all", "--format", "nvfp4", *ONE_SAMPLE,
                           "--calib-all-experts")
    assert code == 0, err
    b = tmp_path / "all"
    ma, mb = manifest(a)["moe"], manifest(b)["moe"]
    assert ma["below_min_tokens"] and not mb["below_min_tokens"] and mb["all_experts"]
    assert ma["expert_tokens"] == mb["expert_tokens"]  # routing unchanged: the same tokens per expert
    ta, tb = tensors(a), tensors(b)
    # every later activation is unchanged too: the attention input scales agree bit for bit ...
    attn = [k for k in ta if "self_attn" in k and k.endswith("input_global_scale")]
    assert attn and all(torch.equal(ta[k], tb[k]) for k in attn)
    # ... while experts that saw nothing routed now have statistics of their own
    exp = [k for k in ta if ".experts." in k and k.endswith("input_global_scale")]
    assert any(not torch.equal(ta[k], tb[k]) for k in exp)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next"])
def test_per_expert_calibration_forward_is_transformers_eager(family, family_src):
    """The experts function calibration installs computes exactly what transformers' eager loop does."""
    from tfcompile.calibration.moe import MoERecorder

    src = family_src(family)
    model = model_class(src).from_pretrained(str(src), dtype=torch.bfloat16).eval()
    model.set_experts_implementation("eager")
    x = ids()
    with torch.no_grad():
        want = model(x).logits
        seen = []
        rec = MoERecorder(model, lambda name, t: seen.append(name))
        got = model(x).logits
        rec.remove()
    assert torch.equal(got, want)
    assert {n.rsplit(".", 1)[1] for n in seen} == {"gate_proj", "up_proj", "down_proj"}


def test_gptq_batch_of_experts_equals_one_at_a_time():
    from tfcompile.kernels.formats.quantizer import weight_quantizer
    from tfcompile.passes.quantize.gptq import gptq_values

    grid = weight_quantizer("nvfp4")  # E2M1 elements
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 32, 64, generator=g)
    x = torch.randn(6, 100, 64, generator=g)
    h = x.transpose(1, 2) @ x / 100
    m = torch.full((6, 32, 64), 0.25)
    batch = gptq_values(w, h, m, grid)
    for i in range(6):
        assert torch.equal(batch[i], gptq_values(w[i], h[i], m[i], grid))


def _kl(family_src, art, family):
    code, out, err = run_cli("eval", art, "--reference", family_src(family), "--max-tokens", "1024",
                             "--seq-len", "64", "--json")
    assert code == 0, err
    return json.loads(out)["metrics"]["kl_mean"]


def test_gptq_on_moe_lowers_kl_against_rtn(family_src, tmp_path):
    """One Hessian per expert from its routed tokens (a shared or fused one is llm-compressor #2939)."""
    src = family_src("qwen3_moe")
    calib = ("--calib", "python-doc", "--calib-samples", "16", "--calib-seq-len", "64")
    rtn = quantize(src, tmp_path / "rtn", "mxfp4a16")
    gptq = quantize(src, tmp_path / "gptq", "mxfp4a16", "--algorithm", "gptq", *calib,
                    "--set", "calibrate.moe_min_tokens=32")
    layers = manifest(gptq)["layers"]
    experts = [x for x in layers if ".experts." in x["module"]]
    assert sum(x["algorithm"] == "gptq" for x in experts) >= len(experts) // 2  # most experts had their Hessian
    assert all(x.get("gptq_batch") for x in experts if x["algorithm"] == "gptq")
    assert _kl(family_src, gptq, "qwen3_moe") < _kl(family_src, rtn, "qwen3_moe")


def test_experts_with_too_few_tokens_stay_rtn_with_a_warning(family_src, tmp_path):
    code, _, err = run_cli("quantize", family_src("qwen3_moe"), "-o", tmp_path / "out", "--format", "nvfp4a16",
                           "--algorithm", "gptq", *ONE_SAMPLE)
    assert code == 0, err
    assert re.search(r"gptq: \d+ Linear\(s\) have no Hessian", " ".join(err.split()))
    algos = {x["module"]: x["algorithm"] for x in manifest(tmp_path / "out")["layers"]}
    assert "rtn (no Hessian)" in {a for m, a in algos.items() if ".experts." in m}
    assert {a for m, a in algos.items() if "self_attn" in m} == {"gptq"}


@pytest.mark.parametrize("layout", ["v5", "gpt_oss"])
def test_fused_experts_split_and_refuse_exactly(layout):
    from tfcompile.families import GPT_OSS, V5
    from tfcompile.families.experts import fuse_bias, fuse_weight, split_slices, take, PROJS

    lay = {"v5": V5, "gpt_oss": GPT_OSS}[layout]
    e, h, i = 4, 64, 96
    g = torch.Generator().manual_seed(1)
    gu = torch.randn((e, h, 2 * i) if lay.transposed else (e, 2 * i, h), generator=g)
    dn = torch.randn((e, i, h) if lay.transposed else (e, h, i), generator=g)
    parts = {p: [None] * e for p in PROJS}
    for name, t in (("m.experts.gate_up_proj", gu), ("m.experts.down_proj", dn)):
        for s in split_slices(name, tuple(t.shape), h, lay):
            w = take(t, s.expert, s.rows, s.transposed)
            assert tuple(w.shape) == s.shape  # [out, in] as a Linear
            parts[s.module.rsplit(".", 1)[1]][s.expert] = w
    fused = fuse_weight(parts, lay)
    assert torch.equal(fused["gate_up_proj"], gu) and torch.equal(fused["down_proj"], dn)
    if lay.interleaved:  # GPT-OSS: gate is the even columns of gate_up, as transformers' _apply_gate reads it
        assert torch.equal(parts["gate_proj"][2], gu[2][:, 0::2].T)
        b = torch.randn(e, 2 * i, generator=g)
        bparts = {"gate_proj": [b[j, 0::2] for j in range(e)], "up_proj": [b[j, 1::2] for j in range(e)],
                  "down_proj": [torch.zeros(h)] * e}
        assert torch.equal(fuse_bias(bparts, lay)["gate_up_proj"], b)


def test_gpt_oss_artifact_holds_per_expert_linears_and_biases(family_src, family_artifact):
    """What engines load: experts.{e}.gate_proj/up_proj/down_proj (+ .bias), gate = even columns."""
    from safetensors import safe_open

    src, art = family_src("gpt_oss"), family_artifact("gpt_oss", "fp8-block")
    orig = {}
    with safe_open(src / "model.safetensors", framework="pt") as f:
        orig = {k: f.get_tensor(k) for k in f.keys() if "layers.1.mlp.experts" in k}
    t = tensors(art)
    p = "model.layers.1.mlp.experts"
    for e in range(8):
        assert torch.equal(t[f"{p}.{e}.gate_proj.bias"], orig[f"{p}.gate_up_proj_bias"][e, 0::2])
        assert torch.equal(t[f"{p}.{e}.up_proj.bias"], orig[f"{p}.gate_up_proj_bias"][e, 1::2])
        assert torch.equal(t[f"{p}.{e}.down_proj.bias"], orig[f"{p}.down_proj_bias"][e])
        gate = t[f"{p}.{e}.gate_proj.weight"].float() * t[f"{p}.{e}.gate_proj.weight_scale"].float()
        want = orig[f"{p}.gate_up_proj"][e][:, 0::2].T.float()
        assert gate.shape == want.shape and (gate - want).norm() / want.norm() < 0.05  # FP8: ~2% error
    assert f"{p}.gate_up_proj_bias" not in t and f"{p}.gate_up_proj" not in t


def test_eval_quantizes_each_experts_input_with_its_own_scale(family_artifact):
    """W4A4 NVFP4 MoE: tfcompile eval runs the fused experts expert by expert, gate/up and down_proj
    inputs each through NVFP4 with that expert's own input_global_scale (as an engine does)."""
    from tfcompile.evaluate.models import load_candidate
    from tfcompile.kernels.formats import dequantize, quantize_nvfp4_act

    art = family_artifact("qwen3_moe", "nvfp4", *ONE_SAMPLE)
    t = tensors(art)
    cand = load_candidate(art, torch.float32)
    assert cand.experts is not None and not cand.warnings
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    for e in (0, 5):
        for proj, width in (("gate_proj", 64), ("down_proj", 32)):
            name = f"model.layers.1.mlp.experts.{e}.{proj}"
            g = t[f"{name}.input_global_scale"].float()
            want = dequantize(quantize_nvfp4_act(x[:, :width], g)).float()
            assert torch.equal(cand.experts.transform(name, x[:, :width]), want)
    with torch.no_grad():
        cand.model(torch.randint(4, 250, (1, 16)))
    assert sum(cand.experts.tokens.values()) == 16 * 2 * 2  # the emulated loop ran, both MoE layers


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss", "qwen3_next"])
def test_expert_names_are_what_engines_map(family, family_artifact):
    """vLLM (`fused_moe_make_expert_params_mapping`) and SGLang (`FusedMoE.make_expert_params_mapping`),
    both with ckpt_gate_proj_name="gate_proj", ckpt_up_proj_name="up_proj", ckpt_down_proj_name="down_proj",
    match checkpoint tensors by the substring `experts.{e}.{name}.`: every expert and projection must have
    its tensors under that name, and no fused expert tensor may remain."""
    t = tensors(family_artifact(family, "nvfp4a16"))
    layers = sorted({m.group(1) for k in t if (m := re.search(r"(.*\.experts)\.\d+\.", k))})
    assert len(layers) >= 2
    for layer in layers:
        for e in range(8):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                got = {k.rsplit(".", 1)[1] for k in t if k.startswith(f"{layer}.{e}.{proj}.")}
                assert {"weight_packed", "weight_scale", "weight_global_scale"} <= got, (layer, e, proj, got)
    assert not [k for k in t if re.search(r"\.experts\.(gate_up_proj|down_proj)", k)]


def test_gptq_expert_batches_give_the_same_bytes_as_one_expert_at_a_time(family_src, tmp_path):
    src = family_src("qwen3_moe")
    outs = [quantize(src, tmp_path / f"b{b}", "mxfp4a16", "--algorithm", "gptq", "--set",
                     f"quantize.gptq_expert_batch={b}") for b in (1, 8)]
    a, b = ((o / "model.safetensors").read_bytes() for o in outs)
    assert a == b
