"""Adding a serving engine is one declaration (tfcompile/engines.py `Engine`): a toy engine,
registered in that one table and nowhere else, is validated as a layout target, gets its own
weight view and KV-cache descriptor, and is checked by the engine rules with its own quirks
(docs/design.md "What a change touches": the serving-engine row is counted by this test)."""

from __future__ import annotations

import json

import pytest

import tfcompile.api as api
from tfcompile import engines
from tfcompile.artifact.engines import engine_problems
from tfcompile.engines import BackendRules, Engine
from tfcompile.errors import RecipeError

TOY_BACKEND = BackendRules("toyserve", "toyattn", ("HND",), "pow2", 32, None, 8, ("bf16", "fp16", "fp8_e4m3"),
                           "no", ("half",), True, "a toy engine for tests/test_toy_engine.py")


def _toy(**quirks) -> Engine:
    kw = dict(fp8_block_partitions=False, builds_unquantized=False, mxfp4a16_as_w4a4=False,
              checked_by_default=False) | quirks
    return Engine("toyserve", (TOY_BACKEND,), **kw)


def test_unknown_before_registration():
    with pytest.raises(RecipeError, match="'toyserve' is not a known engine"):
        api.manager.validate(api.build_recipe(fmt="nvfp4a16", sets=["layout.target=toyserve"]))


def test_a_registered_toy_engine_gets_its_view_and_its_checks(monkeypatch, tiny_llama_src, tmp_path):
    monkeypatch.setitem(engines.ENGINES, "toyserve", _toy())
    out = tmp_path / "out"
    ctx = api.quantize(tiny_llama_src, out, fmt="nvfp4a16", sets=[
        "layout.target=toyserve", 'verify.engines=["toyserve"]', "verify.engine_strict=true"])
    kv = json.loads((out / "tfcompile" / "kv_cache.json").read_text())
    assert kv["engine"] == "toyserve" and kv["backend"] == "toyattn" and kv["layout"] == "HND"
    assert kv["block_size"] == 32  # the toy's default page, not any real engine's
    view = {p.name for p in (out / "toyserve").rglob("*.safetensors")}
    assert view, "a fusing engine gets its weight view under OUT/<engine>/"
    assert ctx.pass_stats["verify"]["engines"] == {"toyserve": "serves it as written"}


def test_the_toy_s_quirks_are_its_declaration():
    """fp8-block partitions: a doc vLLM refuses at --tp 2 is refused by a toy that declares the quirk
    and served by one that does not."""
    doc = {"scheme": {"name": "fp8-block"}, "family": "llama", "groups": [],
           "layers": [{"module": "model.layers.0.mlp.down_proj", "shape": [256, 384], "format": "fp8-block"}]}
    assert engine_problems(doc, "vllm", tp=2)  # K / tp = 192: not whole 128-blocks
    for quirk, refused in ((True, True), (False, False)):
        engines.ENGINES["toyserve"] = _toy(fp8_block_partitions=quirk)
        try:
            assert bool(engine_problems(doc, "toyserve", tp=2)) == refused
        finally:
            del engines.ENGINES["toyserve"]
