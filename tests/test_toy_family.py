"""Adding a model family is one rule set (tfcompile/families/family.py `Family`): a toy family for
Llama, declared in this file and registered with `register_family` (no edit to select, the engine
checks, calibration or the CLI), decides what stays in high precision, which Linears share an
NVFP4 global scale, what `select.include` accepts and which engine cannot serve it
(docs/design.md "What a change touches": the model-family row is counted by this test).

Without the toy, Llama has no rules (GENERIC): q/k/v and gate/up are fused, every standard
projection is quantized, and vLLM serves it; each assertion below checks the opposite."""

from __future__ import annotations

import json

import pytest

import tfcompile.api as api
from tfcompile.artifact.engines import engine_problems
from tfcompile.errors import RecipeError
from tfcompile.families import Family, Keep, family_of, register_family, unregister_family

FIRST_DOWN = Keep(r"re:(.*\.)?layers\.0\.mlp\.down_proj$", "layer 0's down projection",
                  "a toy rule: the first layer's MLP output feeds every later layer", "toy_first_down")
# gate and up each in their own role: no shared global scale between them (the generic rule fuses them)
TOY = Family("toyfam", ("llama",), keep=(FIRST_DOWN,), fuse={"gate_proj": "toy_gate", "up_proj": "toy_up"},
             no_model=("vllm",))


@pytest.fixture
def toy_family():
    register_family(TOY)
    yield TOY
    unregister_family(TOY.name)


def _manifest(out) -> dict:
    return json.loads((out / "tfcompile" / "manifest.json").read_text())


def _modules(doc) -> set[str]:
    return {x["module"] for x in doc["layers"]}


def test_llama_has_no_rules_before_registration(tiny_llama_src, tmp_path):
    assert family_of({"model_type": "llama"}).name == "generic"
    doc = _manifest(api.quantize(tiny_llama_src, tmp_path / "out", fmt="nvfp4a16").out_dir)
    assert "model.layers.0.mlp.down_proj" in _modules(doc)
    assert ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"] in doc["groups"]
    assert not [p for p in engine_problems(doc, "vllm") if "no model class" in p.message]
    with pytest.raises(RecipeError, match="toy_first_down"):
        api.manager.validate(api.build_recipe(fmt="nvfp4", sets=['select.include=["toy_first_down"]']))


def test_a_registered_toy_family_decides_keep_fuse_and_engines(toy_family, tiny_llama_src, tmp_path):
    doc = _manifest(api.quantize(tiny_llama_src, tmp_path / "out", fmt="nvfp4a16").out_dir)
    assert doc["family"] == "toyfam"
    assert "model.layers.0.mlp.down_proj" in doc["ignore"]
    assert "model.layers.0.mlp.down_proj" not in _modules(doc)
    assert "model.layers.1.mlp.down_proj" in _modules(doc)  # the rule names layer 0 only
    assert not any("gate_proj" in " ".join(g) and "up_proj" in " ".join(g) for g in doc["groups"])
    assert [p for p in engine_problems(doc, "vllm") if "no model class" in p.message]
    # the toy's include switch is accepted and quantizes the kept class anyway
    inc = _manifest(api.quantize(tiny_llama_src, tmp_path / "inc", fmt="nvfp4a16",
                                 sets=['select.include=["toy_first_down"]']).out_dir)
    assert "model.layers.0.mlp.down_proj" in _modules(inc)


def test_registration_refuses_a_model_type_with_rules():
    with pytest.raises(ValueError, match="already have rules"):
        register_family(Family("toyfam2", ("qwen3",)))
    with pytest.raises(ValueError, match="not registered"):
        unregister_family("qwen3")
