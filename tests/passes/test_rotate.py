"""Rotations fused into the weights (tfcompile/rotate, passes/rotate.py).

- the Hadamard constructions give H H^T = n I for the orders of real models, and `rotation` is
  orthogonal and seeded;
- the rotated checkpoint computes the same function: transformers loads it (no online
  transform) and its fp32 logits equal the original's to float32 rounding, for a tied and an
  untied model with random norm weights (so the norm folds are exercised), R1 alone and R1+R2;
- the residual stream really is rotated (an outlier channel is spread), q_norm/k_norm-style
  norms are left alone, unsupported architectures are refused with a hint;
- R1 leaves the channels a norm switches off unrotated (`rotate.keep_suppressed`, `rotate.keep`),
  and on a model whose massive activation lives in such a channel that keeps the quantized
  model close to the original, where rotating the channel too ruins it (docs/accuracy.md "Why
  rotations hurt");
- a rotated nvfp4 artifact verifies, records the rotation and the original source files, and
  loads in transformers + compressed-tensors with tfcompile's own dequantized weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tfcompile.rotate.fuse import suppressed_channels
from tfcompile.rotate.hadamard import hadamard, rotation, rotation_keeping

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
from interop_util import our_dequantized_weights, read_tensors  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 12, 20, 36, 64, 576, 768, 896, 960, 3584, 5120])
def test_hadamard_orders(n):
    h = hadamard(n)
    assert h is not None and set(h.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))


def test_rotation_is_orthogonal_and_seeded():
    for n, kind in ((576, "hadamard"), (100, "hadamard"), (64, "random")):
        r = rotation(n, kind, seed=3)
        assert torch.allclose(r @ r.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
        assert torch.equal(r, rotation(n, kind, seed=3)) and not torch.equal(r, rotation(n, kind, seed=4))
    assert hadamard(100) is None  # 100 = 25 x 4: no Paley factor; `rotation` falls back to QR


def test_rotation_keeping_leaves_the_kept_channels_alone():
    keep = (3, 40, 41)
    q = rotation_keeping(64, keep, "hadamard", seed=2)
    assert torch.allclose(q @ q.T, torch.eye(64, dtype=torch.float64), atol=1e-12)
    for c in keep:
        assert torch.equal(q[c], torch.eye(64, dtype=torch.float64)[c]) and torch.equal(q[:, c], q[c])
    rest = [c for c in range(64) if c not in keep]
    assert (q[rest][:, rest].abs() > 0).float().mean() > 0.9  # the other 61 are mixed among themselves
    assert torch.equal(rotation_keeping(64, (), "hadamard", 2), rotation(64, "hadamard", 2))
    with pytest.raises(ValueError, match="outside"):
        rotation_keeping(64, (64,))


def test_suppressed_channels_are_the_ones_a_residual_norm_switches_off():
    g = {f"model.layers.{i}.{n}.weight": torch.ones(32) for i in range(2)
         for n in ("input_layernorm", "post_attention_layernorm")}
    g["model.norm.weight"] = torch.ones(32)
    g["model.layers.1.post_attention_layernorm.weight"][7] = 0.001  # below 1% of the median: off
    g["model.layers.0.input_layernorm.weight"][9] = -0.02  # 2%: still read
    g["model.norm.weight"][30] = 0.0
    assert suppressed_channels(g.__getitem__, 2, 0.01) == (7, 30)
    assert suppressed_channels(g.__getitem__, 2, 0.05) == (7, 9, 30)


def _model(path: Path, tied: bool) -> Path:
    """A 2-layer Llama in fp32 with random norm weights (the folds must carry them)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    from models import make_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    model.save_pretrained(path)
    make_tokenizer(path, 256)
    return path


def _rotated(src: Path, tmp: Path, *sets: str):
    """Run load + rotate; returns the context (its source directory lives as long as it does)."""
    from tfcompile.api import run_pipeline
    from tfcompile.recipe.build import build_recipe

    recipe = build_recipe(fmt="nvfp4a16", sets=["rotate.kind=hadamard", *sets], until="rotate")
    return run_pipeline(src, tmp / "unused", recipe)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("heads", [True, False])
def test_rotated_checkpoint_computes_the_same_function(tmp_path, tied, heads):
    from transformers import AutoModelForCausalLM

    src = _model(tmp_path / "src", tied)
    ctx = _rotated(src, tmp_path, f"rotate.heads={str(heads).lower()}")
    rot_dir = Path(ctx.source.path)
    cfg = json.loads((rot_dir / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and ("lm_head.weight" in ctx.source.names())
    assert ctx.model.tie_word_embeddings is False and ctx.source.provenance["rotate"]["untied_lm_head"] == tied
    assert ctx.source.files == sorted(src.glob("*.safetensors"))  # the manifest hashes the original
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    a = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(rot_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        la, lb = a(ids).logits, b(ids).logits
        ha = a(ids, output_hidden_states=True).hidden_states[1]
        hb = b(ids, output_hidden_states=True).hidden_states[1]
    assert torch.allclose(la, lb, atol=2e-5, rtol=1e-4), (la - lb).abs().max()
    assert not torch.allclose(ha, hb, atol=1e-3)  # ... while the residual stream is rotated
    q = rotation(128, "hadamard", 0).float()
    assert torch.allclose(hb, ha @ q, atol=1e-4)  # exactly by R1
    t = read_tensors(rot_dir)
    assert all(torch.equal(t[n], torch.ones_like(t[n])) for n in t if n.endswith("layernorm.weight"))
    a_v = dict(a.named_parameters())["model.layers.0.self_attn.v_proj.weight"]
    assert torch.allclose(t["model.layers.0.self_attn.v_proj.weight"],
                          (a_v * dict(a.named_parameters())["model.layers.0.input_layernorm.weight"]) @ q,
                          atol=1e-5) != heads  # R2 rotates the value rows on top of R1


def test_unsupported_architecture_is_refused(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    res = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "nvfp4a16", "--set", "rotate.kind=hadamard")
    assert res.code == 1 and "rotate:" in res.err and "hint:" in res.err
    res = run_cli("plan", "--format", "nvfp4a16", "--set", "rotate.kind=magic")
    assert res.code == 1 and "rotate.kind 'magic'" in res.err


def test_rotated_artifact_loads_in_transformers(tmp_path, run_cli):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    src = _model(tmp_path / "src", tied=True)
    out = tmp_path / "out"
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4", "--set", "rotate.kind=hadamard",
                  "--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32", "--json", "-q")
    assert res.code == 0, res.err
    assert run_cli("verify", out).code == 0
    doc = json.loads((out / "tfcompile/manifest.json").read_text())
    assert doc["rotate"]["kind"] == "hadamard" and doc["rotate"]["untied_lm_head"] is True
    assert set(doc["source"]["files"]) == {"model.safetensors"}
    assert not list(tmp_path.glob(".tfcompile-rotate-*"))  # the temporary checkpoint is gone
    stored = read_tensors(out)
    assert "lm_head.weight" in stored and json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16,
                                               quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    want = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, tie_word_embeddings=False).eval()
    sd = want.state_dict()
    with torch.no_grad():
        for name, t in stored.items():
            if name in sd:
                sd[name].copy_(t)  # rotated embeddings, lm_head, unit norms
        mods = dict(want.named_modules())
        for name, w in our_dequantized_weights(out).items():
            mods[name].weight.copy_(w)
        assert torch.equal(got(ids).logits, want(ids).logits)


MASSIVE = 5  # the residual channel of the massive activation in `_massive_model`


def _massive_model(path: Path) -> Path:
    """A 2-layer Llama with SmolLM2's pattern (docs/accuracy.md "Why rotations hurt"): token 0's
    embedding carries a massive value in channel MASSIVE; the post-attention and final norms switch
    that channel off (g = 0); attention reads it: every head's key of token 0 is large along a
    query bias (in the slowest RoPE pair, so the position hardly turns it), so all tokens attend
    to token 0 (an attention sink), whose value is 0 (v_proj's column MASSIVE is 0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    from models import make_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, attention_bias=True)
    model = LlamaForCausalLM(cfg)
    d, slow = 32, (15, 31)  # head_dim; the lowest-frequency RoPE pair
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
            elif name.endswith("bias"):
                p.zero_()
        model.model.embed_tokens.weight[0, MASSIVE] = 300.0
        model.model.norm.weight[MASSIVE] = 0.0
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight[MASSIVE] = 0.0
            att = layer.self_attn
            att.v_proj.weight[:, MASSIVE] = 0.0
            att.k_proj.weight[:, MASSIVE] = 0.0
            for h in range(2):
                att.k_proj.weight[[h * d + slow[0], h * d + slow[1]], MASSIVE] = 1.0
            for h in range(4):
                att.q_proj.bias[[h * d + slow[0], h * d + slow[1]]] = 1.0
    model.save_pretrained(path)
    make_tokenizer(path, 256)
    return path


def test_keeping_the_switched_off_channel_saves_the_quantized_model(tmp_path, run_cli):
    """With the channel rotated too, its massive value meets every column's NVFP4 error in the
    folded W diag(g) Q (its g no longer zeroes it); left unrotated, the error stays small."""
    from transformers import AutoModelForCausalLM

    from tfcompile.evaluate.models import load_candidate

    src = _massive_model(tmp_path / "src")
    ids = torch.randint(1, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    ids[:, 0] = 0  # every row starts with the massive token, as a real text starts with its sink
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()(ids).logits
    err = {}
    for keep in ("true", "false"):
        out = tmp_path / f"out-{keep}"
        res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16", "--set", "rotate.kind=hadamard",
                      "--set", f"rotate.keep_suppressed={keep}", "--json", "-q")
        assert res.code == 0, res.err
        kept = json.loads((out / "tfcompile/manifest.json").read_text())["rotate"]["kept_channels"]
        assert kept == ([MASSIVE] if keep == "true" else [])
        with torch.no_grad():
            got = load_candidate(out, torch.float32).model(ids).logits
        err[keep] = float((got - want).norm() / want.norm())
    assert err["true"] < 0.5 * err["false"], err  # measured: 0.106 against 0.464
