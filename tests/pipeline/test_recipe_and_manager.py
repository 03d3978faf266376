"""Recipe building and schedule validation (no checkpoint needed)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tfcompile.errors import RecipeError
from tfcompile.pipeline import manager
from tfcompile.pipeline.context import Context
from tfcompile.pipeline.passes import REGISTRY, PassResult, PassSpec
from tfcompile.recipe.build import build_recipe, preset_pipeline
from tfcompile.recipe import PassEntry, Recipe


def test_presets_schedule_calibration_only_for_static_activations():
    assert "calibrate" in preset_pipeline("nvfp4")  # W4A4: input_global_scale is static
    assert "calibrate" in preset_pipeline("fp8")  # per-tensor static input_scale
    for fmt in ("nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8-dynamic", "fp8-block"):
        assert "calibrate" not in preset_pipeline(fmt), fmt


def test_file_and_flags_build_the_same_recipe(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('version = 1\nformat = "fp8-block"\n[passes.select]\nignore = ["*.down_proj"]\n'
                 '[passes.pack]\nmax_shard_mb = 100\n')
    from_file = build_recipe(recipe_file=f)
    from_flags = build_recipe(fmt="fp8-block", sets=["pack.max_shard_mb=100"],
                              overrides={"select": {"ignore": ["*.down_proj"]}})
    assert from_file == from_flags
    assert json.dumps(from_file.to_dict()) == json.dumps(from_flags.to_dict())


def test_set_coerces_types_and_rejects_unknown_fields():
    r = build_recipe(fmt="fp8", sets=["calibrate.samples=3", "verify.strict=false"])
    assert r.config("calibrate").samples == 3 and r.config("verify").strict is False
    with pytest.raises(RecipeError, match="unknown option.*bogus"):
        build_recipe(fmt="fp8", sets=["calibrate.bogus=1"])
    with pytest.raises(RecipeError, match="expected int"):
        build_recipe(fmt="fp8", sets=["calibrate.samples=many"])
    with pytest.raises(RecipeError, match="pass.field=value"):
        build_recipe(fmt="fp8", sets=["samples=3"])


def test_recipe_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("version = 1\nformat = [\n")
    with pytest.raises(RecipeError, match="bad.toml"):
        build_recipe(recipe_file=bad)
    old = tmp_path / "old.toml"
    old.write_text('version = 7\nformat = "fp8"\n')
    with pytest.raises(RecipeError, match="version 7"):
        build_recipe(recipe_file=old)


def test_ignore_extends_instead_of_replacing(tmp_path):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"version": 1, "format": "nvfp4a16",
                             "passes": {"select": {"ignore": ["a.*"]}}}))
    r = build_recipe(recipe_file=f, overrides={"select": {"ignore": ["b.*"]}})
    assert r.config("select").ignore == ("a.*", "b.*")


def test_validate_names_the_pass_and_its_predecessors():
    r = build_recipe(fmt="nvfp4a16", skip=["quantize"])
    with pytest.raises(RecipeError) as e:
        manager.validate(r)
    msg = str(e.value)
    assert "pass 'pack' requires program" in msg and "load, select" in msg
    assert "'quantize'" in e.value.hint


def test_until_cuts_the_pipeline():
    assert build_recipe(fmt="nvfp4a16", until="select").names() == ("load", "select")


@dataclass(frozen=True)
class _Cfg:
    pass


def test_manager_runs_in_order_records_stats_and_names_failures(tmp_path):
    calls = []

    def ok(ctx, cfg, rep):
        calls.append("ok")
        return PassResult(ctx.with_(plan="p"), {"n": 1})

    def boom(ctx, cfg, rep):
        calls.append("boom")
        raise ValueError("kaput")

    REGISTRY["_t_ok"] = PassSpec("_t_ok", _Cfg, frozenset({"source_path"}), frozenset({"plan"}), ok, "")
    REGISTRY["_t_boom"] = PassSpec("_t_boom", _Cfg, frozenset({"plan"}), frozenset(), boom, "")
    try:
        ctx = Context(source_path=tmp_path, out_dir=None, recipe=None)
        good = Recipe(1, "custom", (PassEntry("_t_ok", _Cfg()),))
        out = manager.run(ctx, good)
        assert out.plan == "p" and out.pass_stats["_t_ok"]["n"] == 1
        bad = Recipe(1, "custom", (PassEntry("_t_ok", _Cfg()), PassEntry("_t_boom", _Cfg())))
        with pytest.raises(manager.PassFailed) as e:
            manager.run(ctx, bad)
        assert "pass '_t_boom' failed: ValueError: kaput" in str(e.value)
        assert "passes run before it: _t_ok" in str(e.value)
        assert calls == ["ok", "ok", "boom"]
    finally:
        REGISTRY.pop("_t_ok")
        REGISTRY.pop("_t_boom")


def test_pass_that_does_not_produce_what_it_declares_fails(tmp_path):
    REGISTRY["_t_lazy"] = PassSpec("_t_lazy", _Cfg, frozenset(), frozenset({"plan"}),
                                   lambda c, cfg, r: PassResult(c), "")
    try:
        ctx = Context(source_path=tmp_path, out_dir=None, recipe=None)
        with pytest.raises(manager.PassFailed, match="did not produce plan"):
            manager.run(ctx, Recipe(1, "custom", (PassEntry("_t_lazy", _Cfg()),)))
    finally:
        REGISTRY.pop("_t_lazy")


def test_context_is_immutable(tmp_path):
    ctx = Context(source_path=tmp_path, out_dir=None, recipe=None)
    with pytest.raises(Exception):
        ctx.plan = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ctx.with_(nonsense=1)


def test_gptq_and_kv_cache_schedule_calibration_from_any_source(tmp_path):
    for kw in ({"sets": ["quantize.algorithm=gptq"]},
               {"overrides": {"quantize": {"algorithm": "gptq"}}},
               {"sets": ["calibrate.kv_cache=fp8"]}):
        r = build_recipe(fmt="nvfp4a16", **kw)
        assert "calibrate" in r.names(), kw
    assert build_recipe(fmt="nvfp4a16", sets=["quantize.algorithm=gptq"]).config("calibrate").hessian is True


def test_validate_reports_every_reason_at_once():
    """supports() returns reasons instead of raising; validate names all of them in one error."""
    r = build_recipe(fmt="nvfp4a16", sets=["pack.max_shard_mb=-1", "pack.export=[\"bogus\"]"],
                     overrides={"emit": {"targets": ["sm_99x"]}})
    with pytest.raises(RecipeError) as e:
        manager.validate(r)
    msg = str(e.value.message)
    assert "pass 'pack' cannot run: unknown export view(s) ['bogus']" in msg
    assert "pass 'pack' cannot run: max_shard_mb must be positive" in msg
    assert "pass 'emit' cannot run:" in msg and "sm_99x" in msg
    assert e.value.hint.startswith("supported: modelopt") and "2 more reasons" in e.value.hint


def test_a_pass_declares_when_the_standard_pipeline_runs_it():
    """The docs/design.md worked example: a new pass is one registration and its name in the
    standard schedule's list; its `when` decides whether a run schedules it, its `implies`
    schedules what it needs, and no table elsewhere changes."""
    from tfcompile.pipeline.passes import SCHEDULE, given

    @dataclass(frozen=True)
    class _PruneCfg:
        threshold: float = 0.0

    REGISTRY["_t_prune"] = PassSpec("_t_prune", _PruneCfg, frozenset({"program"}), frozenset({"program"}),
                                    lambda c, cfg, r: PassResult(c), "", when=given("_t_prune"),
                                    implies=lambda sel: {"calibrate": {"hessian": True}} if sel.given("_t_prune") else {})
    saved = list(SCHEDULE)
    SCHEDULE.insert(SCHEDULE.index("quantize") + 1, "_t_prune")  # passes/builtin.py's STANDARD list
    try:
        assert "_t_prune" not in build_recipe(fmt="nvfp4a16").names()
        r = build_recipe(fmt="nvfp4a16", sets=["_t_prune.threshold=0.01"])
        names = r.names()
        assert names.index("quantize") < names.index("_t_prune") < names.index("pack")
        assert r.config("_t_prune").threshold == 0.01
        assert "calibrate" in names and r.config("calibrate").hessian is True  # implied, so scheduled
        manager.validate(r)
    finally:
        REGISTRY.pop("_t_prune")
        SCHEDULE[:] = saved


def test_cli_flags_build_the_same_recipe_as_settings(run_cli):
    """Each flag sets the pass field it names (tfcompile/cli/flags.py): `plan` with the flags prints
    the recipe that --set of those fields builds, and a flag that must not schedule its pass alone
    (--no-keep-rejected) does not."""
    from tfcompile.recipe.build import options_recipe
    from tfcompile.recipe.options import RunOptions

    flags = run_cli("plan", "--format", "fp8", "--algorithm", "gptq", "--calib", "random", "--calib-samples", "4",
                    "--max-kl", "0.1", "--target", "sm_90a", "--cutlass", "never", "--layout", "trtllm", "--tp", "2",
                    "--export", "modelopt", "--no-keep-rejected")
    sets = run_cli("plan", "--format", "fp8", *[a for s in [
        "quantize.algorithm=gptq", "calibrate.data=random", "calibrate.samples=4", "eval.max_kl=0.1",
        "eval.keep_rejected=false", "emit.targets=sm_90a", "emit_cutlass.compile=never", "layout.target=trtllm",
        "layout.tp=2", "pack.export=[\"modelopt\"]"]
        for a in ("--set", s)])
    assert flags.code == sets.code == 0, flags.err + sets.err
    assert flags.json() == sets.json()
    emit_cutlass = next(p for p in sets.json()["passes"] if p["name"] == "emit_cutlass")
    assert emit_cutlass["config"]["targets"] == ["sm_90a"]  # taken from --target
    alone = run_cli("plan", "--format", "fp8", "--no-keep-rejected")
    assert "eval" not in [p["name"] for p in alone.json()["passes"]]
    assert options_recipe(RunOptions()).format == "nvfp4"  # neither --format nor --recipe


def test_the_standard_schedule_is_one_list_naming_every_builtin_pass_once():
    """passes/builtin.py's STANDARD is the one place of the standard order (issue 25): every
    built-in pass is in it once, and the presets schedule passes in its order."""
    from tfcompile.passes.builtin import STANDARD
    from tfcompile.pipeline.passes import SCHEDULE

    assert list(STANDARD) == list(SCHEDULE) and len(set(STANDARD)) == len(STANDARD)
    assert set(STANDARD) == {n for n in REGISTRY if not n.startswith("_t_")}
    names = build_recipe(fmt="nvfp4", sets=["eval.max_kl=1", "rotate.kind=hadamard"]).names()
    assert list(names) == [n for n in STANDARD if n in names] and "rotate" in names and "eval" in names
