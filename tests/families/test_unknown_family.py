"""A model type tfcompile has no rules for is quantized conservatively, and says what it kept and why.

Oracle: transformers' own modules of the model (`isinstance(m, nn.Linear)` and the attribute
names of its attention / MLP), built from the config class, not tfcompile's name rules.
- Phi-3 (`phi3`): fused `self_attn.qkv_proj` and `mlp.gate_up_proj` are Linears with non-standard
  names (an engine splits or fuses them its own way): kept; o_proj and down_proj are quantized.
- GPT-2 (`gpt2`): `attn.c_attn`, `mlp.c_fc` ... are transformers `Conv1D` modules storing the
  weight as [in, out], not Linears [out, in]: before this, tfcompile packed them as [N, K] = (out, in)
  and every loader read the transposed matrix. Now all kept.
- Llama (no rules either, standard names): every decoder Linear quantized, nothing listed.
"""

from __future__ import annotations

import json

import torch

from families_util import manifest, run_cli, tensors


def _build(tmp_path, cls_name: str, config) -> "tuple":
    import transformers

    from families_util import load_fixture

    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).to(torch.bfloat16)
    src = tmp_path / "src"
    model.save_pretrained(str(src))
    load_fixture("models").make_tokenizer(src, config.vocab_size)
    return src, model


def _quantize(src, out):
    code, stdout, err = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16", "--json")
    assert code == 0, err
    return json.loads(stdout), err


def test_phi3_keeps_its_fused_projections_and_lists_them(tmp_path):
    from transformers import Phi3Config

    cfg = Phi3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    src, model = _build(tmp_path, "Phi3ForCausalLM", cfg)
    doc, err = _quantize(src, tmp_path / "out")
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    assert linears == {f"model.layers.{i}.{x}" for i in range(2)
                       for x in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    quantized = {x["module"] for x in manifest(tmp_path / "out")["layers"]}
    assert quantized == {n for n in linears if n.endswith(("o_proj", "down_proj"))}
    kept = doc["passes"]["select"]["kept_no_rules"]
    assert {r["modules"]: r["count"] for r in kept} == {"model.layers.*.mlp.gate_up_proj": 2,
                                                        "model.layers.*.self_attn.qkv_proj": 2}
    assert all("no rules" in r["why"] for r in kept)
    assert "'phi3' has no tfcompile rules" in err and "qkv_proj" in err and "all_linears" in err
    assert any("has no tfcompile rules" in w for w in doc["warnings"])
    t = tensors(tmp_path / "out")
    assert t["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.bfloat16
    assert manifest(tmp_path / "out")["family"] == "generic"


def test_gpt2_conv1d_is_never_packed_as_a_linear(tmp_path):
    from transformers import GPT2Config
    from transformers.pytorch_utils import Conv1D

    cfg = GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    src, model = _build(tmp_path, "GPT2LMHeadModel", cfg)
    assert isinstance(model.transformer.h[0].attn.c_attn, Conv1D)  # weight [in 64, out 192]
    doc, err = _quantize(src, tmp_path / "out")
    assert manifest(tmp_path / "out")["layers"] == []
    kept = {r["modules"] for r in doc["passes"]["select"]["kept_no_rules"]}
    assert kept == {f"transformer.h.*.{x}" for x in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}


def test_llama_standard_names_are_all_quantized_and_nothing_is_listed(tmp_path):
    from families_util import load_fixture

    src = load_fixture("models").make_tiny_llama(tmp_path / "src")
    doc, err = _quantize(src, tmp_path / "out")
    assert len(manifest(tmp_path / "out")["layers"]) == 7 * 2  # q/k/v/o, gate/up/down per layer
    assert "kept_no_rules" not in doc["passes"]["select"] and "no tfcompile rules" not in err


def test_all_linears_quantizes_every_decoder_linear_again(tmp_path):
    from transformers import Phi3Config

    cfg = Phi3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    src, _ = _build(tmp_path, "Phi3ForCausalLM", cfg)
    code, out, err = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "nvfp4a16", "--json",
                             "--set", 'select.include=["all_linears"]')
    assert code == 0, err
    assert len(manifest(tmp_path / "out")["layers"]) == 8
    assert "kept_no_rules" not in json.loads(out)["passes"]["select"]
