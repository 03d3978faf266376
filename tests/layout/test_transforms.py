"""Acceptance: every layout transform preserves the model's logits.

The untransformed model is transformers running the artifact's dequantized weights (what
`tfcompile eval` runs). The transformed one is tfcompile.layout.reference.Decoder running the
engine view: per TP shard, fused / gathered rows, the view's RoPE convention, a paged KV cache
in the descriptor's layout and dtype. Differences are max |a - b| / max |b| over all logits;
the figures are printed (pytest -s) and quoted in docs/formats.md.
"""

from __future__ import annotations

import json

import pytest
import torch

from layout_util import CALIB, descriptor, hf_logits, tokens
from tfcompile.layout.reference import Decoder, KVSpec, load_view, max_rel

ROPE = ("--set", "layout.rope=interleaved")
CASES = {  # model -> (format, options): fusion, interleaved RoPE, TP grouping (with KV replication)
    "demo": ("nvfp4a16", ("--layout", "trtllm", "--tp", "2", *ROPE, "--kv-cache", "fp8", *CALIB)),
    "gqa": ("nvfp4a16", ("--layout", "trtllm", "--tp", "4", *ROPE, "--kv-cache", "fp8",
                         "--set", "layout.kv_dtype=nvfp4", *CALIB)),
    "moe": ("nvfp4a16", ("--layout", "trtllm", "--tp", "2", *ROPE, "--kv-cache", "fp8", *CALIB)),
}
VOCAB = {"demo": 4096, "gqa": 256, "moe": 256}
EXACT = 1e-5  # float32: only summation order differs (fused GEMMs, TP partial sums)
# FP8 KV vs the emulation runs in float64. Both sides quantize K/V that they computed in a different
# summation order; in float32 the two differ by a few ulps, and the handful of the ~41k cached values
# that lie that close to an E4M3 rounding midpoint round to neighbouring codes (a 1/16 step), which
# moved the demo's logits by 2e-4 (issue 14) or up to 1e-3, depending on the token sample and the
# CPU's GEMM kernels (3 of 30 samples here). In float64 the paths differ by ~1e-16: no code flips.
EXACT_DTYPE = torch.float64


def _report(**figures):
    print("layout:", json.dumps({k: (round(v, 7) if isinstance(v, float) else v) for k, v in figures.items()}))


@pytest.mark.parametrize("model", list(CASES))
def test_transforms_preserve_logits_float32(quantized, model):
    art = quantized(model, CASES[model][0], *CASES[model][1])
    toks = tokens(VOCAB[model])
    ref = hf_logits(art, toks)
    main = Decoder(load_view(art)).logits(toks)
    assert max_rel(main, ref) < EXACT  # the reference decoder is the transformers model
    view = load_view(art, "trtllm")
    desc = descriptor(art)
    figures = {}
    for name, kv in {"descriptor": KVSpec.from_descriptor(desc, dtype="fp32"),
                     "NHD/16": KVSpec("NHD", 16), "HND/64/pad128": KVSpec("HND", 64, 128)}.items():
        got = Decoder(view, kv).logits(toks, [17])  # prefill 17 tokens, then decode one at a time
        figures[name] = max_rel(got, ref)
        assert figures[name] < EXACT, (name, figures[name])
    _report(model=model, test="float32", main_vs_transformers=max_rel(main, ref), **figures)


@pytest.mark.parametrize("model", ["demo", "moe"])
def test_transforms_preserve_logits_bf16_within_rounding(quantized, model):
    """In bf16 the view may differ from transformers by rounding only: no more than bf16 itself
    moves transformers' logits away from float32 (the yardstick), and far less than a bug would."""
    art = quantized(model, CASES[model][0], *CASES[model][1])
    toks = tokens(VOCAB[model])
    ref32, ref16 = hf_logits(art, toks), hf_logits(art, toks, dtype=torch.bfloat16)
    got = Decoder(load_view(art, "trtllm"), KVSpec.from_descriptor(descriptor(art), dtype="bf16"),
                  dtype=torch.bfloat16).logits(toks, [17])
    yardstick, diff = max_rel(ref16, ref32), max_rel(got, ref16)
    _report(model=model, test="bf16", view_vs_transformers_bf16=diff, bf16_vs_fp32=yardstick,
            view_bf16_vs_fp32=max_rel(got, ref32))
    assert diff <= 2 * yardstick and max_rel(got, ref32) <= 2 * yardstick


# demo seeds 1 and 18 (the slow job): token samples whose float32 comparison flips an FP8 code here
FP8_CASES = [pytest.param(m, s, id=m if s == 0 else f"{m}-tokens{s}", marks=[pytest.mark.slow] if s else [])
             for m, s in [("demo", 0), ("demo", 1), ("demo", 18), ("gqa", 0), ("moe", 0)]]


@pytest.mark.parametrize("model,seed", FP8_CASES)
def test_fp8_kv_cache_matches_emulation_and_costs_little(quantized, model, seed):
    """FP8 KV through the view's pages equals `tfcompile eval`'s FP8 KV emulation on the
    untransformed model (in float64: see EXACT_DTYPE); its distance from the full-precision cache
    is the KV-quantization error."""
    art = quantized(model, CASES[model][0], *CASES[model][1])
    toks = tokens(VOCAB[model], seed=seed)
    off, emulated = (hf_logits(art, toks, kv, dtype=EXACT_DTYPE) for kv in ("off", "auto"))
    kv = KVSpec.from_descriptor(descriptor(art), dtype="fp8_e4m3")
    got = Decoder(load_view(art, "trtllm"), kv, dtype=EXACT_DTYPE).logits(toks, [17])
    _report(model=model, test="fp8-kv", seed=seed, view_vs_emulation=max_rel(got, emulated),
            fp8_kv_error=max_rel(got, off))
    assert max_rel(got, emulated) < EXACT
    assert 0 < max_rel(got, off) < 0.1


def test_nvfp4_kv_cache(quantized):
    art = quantized("gqa", CASES["gqa"][0], *CASES["gqa"][1])
    desc = descriptor(art)
    assert desc["dtype"] == "nvfp4" and desc["nvfp4"]["block"] == 16
    toks = tokens(VOCAB["gqa"])
    off = hf_logits(art, toks, "off")
    view = load_view(art, "trtllm")
    nv = Decoder(view, KVSpec.from_descriptor(desc)).logits(toks, [17])
    fp8 = Decoder(view, KVSpec.from_descriptor(desc, dtype="fp8_e4m3")).logits(toks, [17])
    _report(model="gqa", test="nvfp4-kv", nvfp4_kv_error=max_rel(nv, off), fp8_kv_error=max_rel(fp8, off))
    assert max_rel(fp8, off) < max_rel(nv, off) < 0.5


def test_unfused_vllm_view_replicates_kv_heads_and_per_head_scales(quantized):
    """vLLM fuses on load, so its view is unfused: with --tp 4 > 1 KV head, k/v rows and the
    per-head FP8 scales are replicated (one KV head per shard), q untouched."""
    art = quantized("gqa", "mxfp4a16", "--layout", "vllm", "--tp", "4", "--kv-cache", "fp8", "--kv-per-head", *CALIB)
    lay = json.loads((art / "vllm" / "layout.json").read_text())
    assert lay["heads"]["kv_head_map"] == [0, 0, 0, 0] and lay["heads"]["view_num_key_value_heads"] == 4
    assert json.loads((art / "vllm" / "config.json").read_text())["num_key_value_heads"] == 4
    from tests_helpers import tensors

    main, view = tensors(art), tensors(art / "vllm")
    k = "model.layers.0.self_attn.k_proj.weight_packed"
    assert torch.equal(view[k], main[k].repeat(4, 1))  # 4 replicas of the one KV head (32 rows)
    assert view["model.layers.0.self_attn.k_scale"].shape == (4, 1, 1)
    assert "model.layers.0.self_attn.qkv_proj.weight_packed" not in view
    assert torch.equal(view["model.layers.0.self_attn.q_proj.weight_packed"],
                       main["model.layers.0.self_attn.q_proj.weight_packed"])
    toks = tokens(256)
    got = Decoder(load_view(art, "vllm"), KVSpec.from_descriptor(descriptor(art)), dtype=EXACT_DTYPE).logits(toks, [9])
    emulated = hf_logits(art, toks, "auto", dtype=EXACT_DTYPE)
    _report(model="gqa", test="vllm-per-head-fp8", view_vs_emulation=max_rel(got, emulated),
            fp8_kv_error=max_rel(got, hf_logits(art, toks, "off", dtype=EXACT_DTYPE)))
    assert max_rel(got, emulated) < EXACT


def test_flashinfer_collapses_per_head_scales_and_pads_head_dim(quantized):
    art = quantized("gqa2", "nvfp4a16", "--layout", "vllm", "--set", "layout.backend=flashinfer",
                    "--kv-cache", "fp8", "--kv-per-head", *CALIB)
    desc = descriptor(art)
    assert desc["layout"] == "HND" and desc["head_dim"] == 32 and desc["head_dim_padded"] == 64
    assert desc["scales"]["granularity"] == "attn_head" and desc["scales"]["engine_reads"] == "max over heads"
    assert any("collapses per-head KV scales" in w for w in desc["warnings"])
    assert not (art / "vllm").exists()  # nothing to change in the weights for vLLM
    toks = tokens(256)
    off = hf_logits(art, toks, "off")
    view = load_view(art)
    collapsed = Decoder(view, KVSpec.from_descriptor(desc)).logits(toks, [9])
    per_head = Decoder(view, KVSpec.from_descriptor(desc, scales="artifact")).logits(toks, [9])
    _report(model="gqa2", test="flashinfer", collapsed_error=max_rel(collapsed, off),
            per_head_error=max_rel(per_head, off))
    exact = Decoder(view, KVSpec.from_descriptor(desc, scales="artifact"), dtype=EXACT_DTYPE).logits(toks, [9])
    assert max_rel(exact, hf_logits(art, toks, "auto", dtype=EXACT_DTYPE)) < EXACT
    assert not torch.equal(collapsed, per_head)  # 2 KV heads: the max over heads is a coarser scale


def test_view_rows_are_the_gathered_main_rows(quantized):
    """Q(gather(W)) == gather(Q(W)): the fused view holds exactly the compressed-tensors view's
    rows in shard order (q_r, k_r, v_r per shard, KV replicated), one shared global scale."""
    from tests_helpers import tensors

    art = quantized("gqa", CASES["gqa"][0], *CASES["gqa"][1])
    main, view = tensors(art), tensors(art / "trtllm")
    lay = json.loads((art / "trtllm" / "layout.json").read_text())
    order = lay["heads"]["rope_row_order"]
    p = "model.layers.1.self_attn"
    for suffix in ("weight_packed", "weight_scale"):
        q, k, v = (main[f"{p}.{x}_proj.{suffix}"] for x in "qkv")
        parts = []
        for r in range(4):  # shard r: query head r, KV head 0 (replicated)
            parts += [q[[r * 32 + i for i in order]], k[order], v]
        want = torch.cat(parts)
        assert torch.equal(view[f"{p}.qkv_proj.{suffix}"].view(torch.uint8), want.view(torch.uint8))
    g = {main[f"{p}.{x}_proj.weight_global_scale"].item() for x in "qkv"}
    assert g == {view[f"{p}.qkv_proj.weight_global_scale"].item()}


def test_fp8_per_tensor_fused_scale_is_unified_before_quantization(quantized):
    from tests_helpers import tensors

    art = quantized("gqa", "fp8", "--layout", "trtllm", *CALIB)
    main, view = tensors(art), tensors(art / "trtllm")
    p = "model.layers.0.self_attn"
    members = [main[f"{p}.{x}_proj.weight_scale"].float() for x in "qkv"]
    fused = view[f"{p}.qkv_proj.weight_scale"].float()
    assert fused.shape == (1,) and fused.item() == max(m.item() for m in members)
    assert view[f"{p}.qkv_proj.input_scale"].item() == main[f"{p}.q_proj.input_scale"].item()


def test_manifest_records_transforms_and_reruns_are_byte_identical(quantized, sources, tmp_path):
    from tfcompile.cli.main import main as cli

    opts = ["--format", "nvfp4a16", "--layout", "trtllm", "--tp", "2", *ROPE, "-q"]
    a = quantized("moe", *opts[1:2], *opts[2:-1])
    b = tmp_path / "again"
    assert cli(["quantize", str(sources["moe"]), "-o", str(b), *opts]) == 0
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    man = json.loads((a / "tfcompile" / "manifest.json").read_text())
    lay = man["layout"]
    kinds = [t["transform"] for t in lay["transforms"]]
    assert kinds == ["fuse", "rope", "tp_heads"]
    names = lay["transforms"][0]["names"]
    assert names["model.layers.*.self_attn.qkv_proj"] == ["q_proj", "k_proj", "v_proj"]
    assert names["model.layers.*.mlp.experts.*.gate_up_proj"] == ["gate_proj", "up_proj"]
    assert lay["kv_cache"]["sha256"] == man["files"]["tfcompile/kv_cache.json"]
    assert lay["view"]["sha256"] == man["files"]["trtllm/layout.json"]
    assert "trtllm" in man["views"]
