"""Attention variants in the layout pass: kv_cache.json per layer, checked by the reference attention.

MLA (DeepSeek-V3, Kimi K2) caches the latent c_kv + RoPE key k_pe with one k_scale; GPT-OSS has
sliding-window layers and per-head sinks; Qwen3-Next's linear-attention layers have no KV cache.
"""

from __future__ import annotations

import json

import pytest
import torch

from families_util import CALIB, ids, model_class

KV = ("--kv-cache", "fp8", "--layout", "vllm")


def _descriptor(art):
    return json.loads((art / "tfcompile" / "kv_cache.json").read_text())


def test_mla_descriptor_is_the_latent_entry(family_artifact):
    d = _descriptor(family_artifact("deepseek_v3", "nvfp4a16", *KV, *CALIB))
    assert d["attention"] == "mla" and d["num_kv_heads"] == 1
    assert d["page_shape"] == [d["block_size"], 32 + 16] and d["head_dim"] == 48  # kv_lora_rank + rope dim
    assert [e["kind"] for e in d["layers"]] == ["mla"] * 4
    e = d["layers"][0]
    assert (e["latent_dim"], e["rope_dim"], e["entry_dim"]) == (32, 16, 48)
    assert e["scales"]["k_scale"] == "model.layers.0.self_attn.k_scale"
    assert d["scales"]["engine_reads"] == "k_scale for the whole entry"


def test_gpt_oss_descriptor_has_windows_and_sinks(family_artifact):
    d = _descriptor(family_artifact("gpt_oss", "nvfp4a16", *KV, *CALIB))
    assert d["attention"] == "full+sliding+sinks"
    assert [(e["kind"], e.get("window")) for e in d["layers"]] == [("sliding", 8), ("full", None)] * 2
    assert all(e["sinks"] == f"model.layers.{e['layer']}.self_attn.sinks" for e in d["layers"])


def test_linear_attention_layers_have_no_kv_cache(family_artifact):
    art = family_artifact("qwen3_next", "nvfp4a16", *KV, *CALIB)
    d = _descriptor(art)
    assert [(e["kind"], e["kv_cache"]) for e in d["layers"]] == [("linear", False), ("full", True)] * 2
    assert all("scales" not in e and "page_shape" not in e for e in d["layers"] if e["kind"] == "linear")
    kv = json.loads((art / "tfcompile" / "manifest.json").read_text())["kv_modules"]
    assert kv == ["model.layers.1.self_attn", "model.layers.3.self_attn"]  # only the full-attention layers


def test_standard_model_descriptor_is_unchanged(family_artifact):
    d = _descriptor(family_artifact("qwen3", "nvfp4a16", *KV, *CALIB))
    assert d["attention"] == "mha" and "layers" not in d


def _rotary(model, t):
    x = torch.zeros(1, t, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(x, torch.arange(t)[None])
    return x, cos, sin


def test_mla_reference_reproduces_transformers_with_the_cached_entry(family_src, family_artifact):
    from tfcompile.evaluate.models import load_candidate
    from tfcompile.layout.mla import mla_reference

    art = family_artifact("deepseek_v3", "nvfp4a16", *KV, *CALIB)
    cand = load_candidate(art, torch.float32)  # the FP8 latent cache emulated as tfcompile eval does
    attn = cand.model.model.layers[2].self_attn
    t = 20
    _, cos, sin = _rotary(cand.model, t)
    x = torch.randn(1, t, 64, generator=torch.Generator().manual_seed(0))
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = attn(x, (cos, sin), mask)[0][0]
    k_scale = cand.kv_scales.scales["model.layers.2.self_attn"][0]
    got = mla_reference(attn, x[0], cos[0], sin[0], dtype="fp8_e4m3", k_scale=k_scale, layout="NHD", block=16)
    rel = lambda a: float((a - want).abs().max() / want.abs().max())  # noqa: E731
    assert rel(got) < 1e-5
    assert rel(mla_reference(attn, x[0], cos[0], sin[0], dtype="fp32")) > 1e-3  # the FP8 cache matters
    # and the cache holds exactly what transformers caches: with the emulation off, a float cache agrees
    plain = model_class(family_src("deepseek_v3")).from_pretrained(str(family_src("deepseek_v3")),
                                                                   dtype=torch.float32).eval()
    a2 = plain.model.layers[2].self_attn
    with torch.no_grad():
        w2 = a2(x, (cos, sin), mask)[0][0]
    assert float((mla_reference(a2, x[0], cos[0], sin[0]) - w2).abs().max() / w2.abs().max()) < 1e-5


def test_mla_kv_scale_is_the_cached_latent_amax(family_src, family_artifact):
    """k_scale = max(|c_kv|, |k_pe|) / 448 of what transformers' own cache holds for the calibration tokens."""
    from transformers import DynamicCache

    from tfcompile.calibration.datasets import calibration_tokens
    from families_util import tensors

    src = family_src("deepseek_v3")
    t = tensors(family_artifact("deepseek_v3", "nvfp4a16", *KV, *CALIB))
    model = model_class(src).from_pretrained(str(src), dtype=torch.bfloat16).eval()
    toks = calibration_tokens("random", None, samples=2, seq_len=32, seed=0, vocab=256)
    amax = torch.zeros(4)
    for row in toks:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(row[None], cache=cache, use_cache=True)
        for i, layer in enumerate(cache.layers):
            amax[i] = max(amax[i], layer.keys.abs().max().float(), layer.values.abs().max().float())
    for i in range(4):
        k, v = t[f"model.layers.{i}.self_attn.k_scale"], t[f"model.layers.{i}.self_attn.v_scale"]
        assert torch.equal(k, v) and k.shape == (1,)
        want = (amax[i] / 448).to(torch.bfloat16)
        want = want if want.float() >= amax[i] / 448 else torch.nextafter(want, torch.tensor(1.0, dtype=want.dtype))
        assert k.item() == want.item(), (i, k.item(), want.item())


@pytest.mark.parametrize("layer", [0, 1])  # sliding (window 8), full
def test_sinks_and_sliding_window_reference_reproduces_gpt_oss(layer, family_src):
    from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb

    from tfcompile.layout.paged_attention import KVFormat, PagedKV, paged_attention

    src = family_src("gpt_oss")
    model = model_class(src).from_pretrained(str(src), dtype=torch.float32).eval()
    attn, t = model.model.layers[layer].self_attn, 20
    _, cos, sin = _rotary(model, t)
    x = torch.randn(1, t, 64, generator=torch.Generator().manual_seed(1))
    kpos, qpos = torch.arange(t)[None], torch.arange(t)[:, None]
    visible = (kpos <= qpos) & ((kpos > qpos - attn.sliding_window) if attn.sliding_window else True)
    mask = torch.zeros(t, t).masked_fill(~visible, float("-inf"))[None, None]
    with torch.no_grad():
        want = attn(x, (cos, sin), mask)[0][0]
        split = lambda p: p(x).view(1, t, -1, 16).transpose(1, 2)  # noqa: E731
        q, k = apply_rotary_pos_emb(split(attn.q_proj), split(attn.k_proj), cos, sin)
        fmt = KVFormat("NHD", 16, 16, 16, "fp32")
        kc, vc = PagedKV(fmt, 2, 8, seed=3), PagedKV(fmt, 2, 8, seed=4)
        kc.append(0, k[0].transpose(0, 1))
        vc.append(0, split(attn.v_proj)[0].transpose(0, 1))
        run = lambda **kw: attn.o_proj(paged_attention(q[0].transpose(0, 1), kc, vc, 0, torch.arange(t), **kw)  # noqa: E731
                                       .reshape(t, -1))
        got = run(window=attn.sliding_window, sinks=attn.sinks)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
        assert not torch.allclose(run(window=attn.sliding_window), want, atol=1e-3)  # sinks matter


def test_kv_observer_leaves_eager_attention_masked(family_src):
    """Calibration's KV observer wraps the model's own attention with its mask (GPT-OSS runs eager
    attention with sinks; a wrapper without a mask function got no causal mask at all)."""
    from tfcompile.calibration.recorders import Recorders

    src = family_src("gpt_oss")
    model = model_class(src).from_pretrained(str(src), dtype=torch.float32).eval()
    model.set_experts_implementation("eager")  # what calibration's per-expert loop computes, bit for bit
    x = ids()
    with torch.no_grad():
        want = model(x).logits
        rec = Recorders(model, set(), kv=True)
        got = model(x).logits
        rec.remove()
    assert torch.equal(got, want) and rec.kv.k
