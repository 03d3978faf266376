"""The tiny-model builders in tests/fixtures/models.py and the committed demo checkpoint."""

from __future__ import annotations

import filecmp
import importlib.util
import json
from pathlib import Path

import torch

from tfcompile.io.checkpoint import open_checkpoint

REPO = Path(__file__).resolve().parents[2]


def test_tiny_llama_shapes(tiny_llama):
    ckpt = open_checkpoint(tiny_llama)
    assert ckpt.config["architectures"] == ["LlamaForCausalLM"]
    assert ckpt.info("model.layers.0.self_attn.q_proj.weight").shape == (128, 128)
    assert ckpt.info("model.layers.0.self_attn.k_proj.weight").shape == (64, 128)  # 2 KV heads x 32
    assert ckpt.info("model.layers.1.mlp.down_proj.weight").shape == (128, 256)
    assert ckpt.info("lm_head.weight").shape == (256, 128)
    assert {ckpt.info(n).dtype for n in ckpt.names()} == {"BF16"}
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in ckpt.aux_files()}


def test_builders_are_deterministic(model_factory, tiny_llama, tmp_path):
    again = model_factory.make_tiny_llama(tmp_path / "again")
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny_llama / name).read_bytes(), name
    other = model_factory.make_tiny_llama(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny_llama / "model.safetensors").read_bytes()


def test_tiny_qwen3_moe_is_saved_per_expert(model_factory, tmp_path):
    ckpt = open_checkpoint(model_factory.make_tiny_qwen3_moe(tmp_path / "moe"))
    assert ckpt.config["model_type"] == "qwen3_moe"
    names = set(ckpt.names())
    assert not any("gate_up_proj" in n for n in names)  # the fused in-memory form is not saved
    for e in range(4):
        p = f"model.layers.1.mlp.experts.{e}"
        assert ckpt.info(f"{p}.gate_proj.weight").shape == (64, 128)
        assert ckpt.info(f"{p}.up_proj.weight").shape == (64, 128)
        assert ckpt.info(f"{p}.down_proj.weight").shape == (128, 64)
    assert ckpt.info("model.layers.0.mlp.gate.weight").shape == (4, 128)
    assert ckpt.info("model.layers.0.self_attn.q_norm.weight").shape == (32,)
    assert len(names) == 2 + 1 + 2 * (4 * 3 + 1 + 2 + 6)  # embed, lm_head, norm; per layer


def test_tokenizer_loads_with_transformers(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    ids = tok("the quick brown fox").input_ids
    assert max(ids) < 256 and tok.decode(ids) == "the quick brown fox"


def test_example_checkpoint_matches_script(tmp_path):
    """examples/tiny-llama is exactly what scripts/make_tiny_llama.py writes."""
    example = REPO / "examples" / "tiny-llama"
    out = tmp_path / "tiny-llama"
    spec = importlib.util.spec_from_file_location("make_tiny_llama_script", REPO / "scripts" / "make_tiny_llama.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(out)]) == 0
    assert script.main([str(out)]) == 1  # refuses to overwrite without --overwrite
    names = sorted(p.name for p in example.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(example, out, names, shallow=False)
    assert errors == []
    # save_pretrained stamps the running transformers version into the two JSON configs: that stamp
    # may differ from the committed one, every other byte may not
    for name in mismatch:
        assert name in ("config.json", "generation_config.json"), f"{name} differs from the script's output"
        ours, theirs = (json.loads((d / name).read_text()) for d in (example, out))
        ours.pop("transformers_version"), theirs.pop("transformers_version")
        assert ours == theirs, name
    assert sum(p.stat().st_size for p in example.iterdir()) < 2 * 2**20
    ckpt = open_checkpoint(example)
    assert ckpt.info("lm_head.weight").shape == (512, 128)
    assert ckpt.get("model.norm.weight").dtype == torch.bfloat16
