"""Passes learn what another will do from the facts its settings promise (tfcompile/pipeline/
intents.py), not from its config: the readers (load, layout, mixed, distill, rotate) give the
same answers as when they read the configs, and a new pass that promises a fact is found."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

import tfcompile.api  # noqa: F401  (registers the passes)
from tfcompile.errors import RecipeError
from tfcompile.pipeline import passes as P
from tfcompile.pipeline.intents import KVCacheScales, LayerSolve, RunsTheModel, SharedGlobalScales, WeightRounding
from tfcompile.recipe import PassEntry
from tfcompile.recipe.build import build_recipe


def test_the_recipe_s_passes_promise_what_their_settings_say():
    r = build_recipe(fmt="nvfp4a16", sets=["calibrate.kv_cache=fp8", "calibrate.kv_per_head=true",
                                           "quantize.algorithm=gptq", "select.fuse_groups=false"])
    assert P.recipe_intent(r, KVCacheScales) == KVCacheScales("fp8", True)
    assert P.recipe_intent(r, WeightRounding) == WeightRounding("gptq", "")
    solve = P.recipe_intent(r, LayerSolve)  # what calibrate's layer loop hands GPTQ's solver
    assert (solve.algorithm, solve.expert_batch, solve.settings) == ("gptq", 8, r.config("quantize"))
    assert P.recipe_intent(r, SharedGlobalScales) == SharedGlobalScales(False)
    assert [f.by for f in P.recipe_intents(r, RunsTheModel)] == ["calibrate"]
    plain = build_recipe(fmt="nvfp4a16")  # data-free: nothing runs the model, no KV scales
    assert P.recipe_intents(plain, RunsTheModel) == [] and P.recipe_intent(plain, KVCacheScales) is None


@pytest.mark.parametrize("sets, message", [
    (["distill.steps=1", "quantize.algorithm=gptq"], "distill trains from round-to-nearest"),
    (["layout.target=trtllm", "select.fuse_groups=false"], "fused view needs select.fuse_groups"),
    (["rotate.kind=hadamard", "distill.steps=1"], "distillation trains against the unrotated model"),
    (["mixed.avg_bits=6", "pack.export=[\"modelopt\"]"], "cannot be combined with --export modelopt"),
    (["mixed.avg_bits=6", "distill.steps=1"], "cannot be combined with distill"),
])
def test_readers_refuse_what_the_promises_rule_out(sets, message):
    with pytest.raises(RecipeError, match=message):
        tfcompile.api.manager.validate(build_recipe(fmt="nvfp4", sets=sets))


@dataclass(frozen=True)
class _ToyConfig:
    kv: str = "fp8"


def test_a_new_pass_s_promise_is_found_without_editing_its_readers(monkeypatch):
    """A toy pass that calibrates KV scales: layout's check reads its promise as it reads calibrate's."""
    monkeypatch.setitem(P.REGISTRY, "toy_kv", P.PassSpec("toy_kv", _ToyConfig, frozenset(), frozenset(),
                                                         lambda *a: None, "", intents=lambda c: (
                                                             KVCacheScales(c.kv, False),)))
    r = build_recipe(fmt="fp8")
    assert P.recipe_intent(r, KVCacheScales) is None
    r = dataclasses.replace(r, passes=(*r.passes, PassEntry("toy_kv", _ToyConfig())))
    assert P.recipe_intent(r, KVCacheScales) == KVCacheScales("fp8", False)
