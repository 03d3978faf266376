"""`--preset best` (tfcompile/schemes.py PRESETS): per format, the settings of the method measured
most accurate on SmolLM2 (docs/accuracy.md), under every other layer of the recipe."""

from __future__ import annotations

import pytest

from tfcompile.errors import RecipeError
from tfcompile.recipe.build import build_recipe
from tfcompile.schemes import PRESETS, SCHEMES, preset_sets


def _values(recipe) -> dict:
    return {e.name: vars(e.config) for e in recipe.passes}


@pytest.mark.parametrize("fmt", sorted(SCHEMES))
def test_every_format_builds_with_the_best_preset(fmt):
    """Each entry names real passes and fields (build_config checks them) and lands in the recipe."""
    values = _values(build_recipe(fmt=fmt, preset="best"))
    for item in preset_sets("best", fmt):
        (name, field), raw = item.split("=", 1)[0].split("."), item.split("=", 1)[1]
        assert str(values[name][field]) == raw, item
    if not preset_sets("best", fmt):  # no entry: the format's own defaults
        assert values == _values(build_recipe(fmt=fmt))


def test_best_changes_the_4bit_formats_and_schedules_their_calibration():
    for fmt in PRESETS["best"]:
        values = _values(build_recipe(fmt=fmt, preset="best"))
        assert values != _values(build_recipe(fmt=fmt)), fmt
        assert values["quantize"]["algorithm"] != "rtn" and "calibrate" in values, fmt


def test_options_recipe_file_and_set_override_the_preset(tmp_path):
    assert _values(build_recipe(fmt="nvfp4a16", preset="best", overrides={"quantize": {"algorithm": "rtn"}})
                   )["quantize"]["algorithm"] == "rtn"
    assert _values(build_recipe(fmt="nvfp4a16", preset="best", sets=["quantize.gptq_damp=0.05"])
                   )["quantize"]["gptq_damp"] == 0.05
    f = tmp_path / "r.toml"
    f.write_text('version = 1\nformat = "nvfp4a16"\n[passes.quantize]\ngptq_damp = 0.02\n')
    assert _values(build_recipe(recipe_file=f, preset="best"))["quantize"]["gptq_damp"] == 0.02


def test_unknown_preset_and_missing_format_are_named():
    with pytest.raises(RecipeError, match="unknown preset 'fastest'"):
        build_recipe(fmt="nvfp4", preset="fastest")
    with pytest.raises(RecipeError, match="no format"):
        build_recipe(sets=["load.allow_unknown_architecture=true"], preset="best")


def test_cli_plan_takes_the_preset(run_cli):
    res = run_cli("plan", "--format", "nvfp4a16", "--preset", "best")
    assert res.code == 0, res.err
    quantize = next(p for p in res.json()["passes"] if p["name"] == "quantize")
    assert f"quantize.algorithm={quantize['config']['algorithm']}" in preset_sets("best", "nvfp4a16")
    bad = run_cli("plan", "--format", "nvfp4a16", "--preset", "nope")
    assert bad.code != 0 and "unknown preset" in bad.err and "hint:" in bad.err


# the bench's options, as the recipe fields they set (bench/acc_distill_smollm2.py ROWS)
_BENCH_FLAGS = {"--lr": ("distill", "lr", float), "--batch": ("distill", "batch", int), "--seed": ("distill", "seed", int),
                "--algorithm": ("quantize", "algorithm", str), "--calib": ("calibrate", "data", str),
                "--calib-samples": ("calibrate", "samples", int), "--calib-seq-len": ("calibrate", "seq_len", int)}


def _bench_recipe(fmt: str, args: list[str], **distill) -> dict:
    sets, tables, it = [], {"distill": dict(distill)} if distill else {}, iter(args)
    for a in it:
        if a == "--set":
            sets.append(next(it))
        else:
            name, field, typ = _BENCH_FLAGS[a]
            tables.setdefault(name, {})[field] = typ(next(it))
    return build_recipe(fmt=fmt, sets=sets, overrides=tables).to_dict()


@pytest.mark.parametrize("fmt,row", [("mxfp4", "mxfp4/distill-rtn"), ("mxfp4a16", "mxfp4a16/distill-rtn"),
                                     ("nvfp4", "nvfp4/distill-rtn-fos"), ("nvfp4a16", "nvfp4a16/distill-rtn")])
def test_distill_preset_is_the_measured_rows_recipe(fmt, row):
    """`distill --preset best` (DISTILL_PRESETS) is, field for field, the recipe of the bench row
    docs/accuracy.md measured, but for the calibration data (`auto`: python-doc where it is
    installed) and the held-out figures (the bench skips them; they change no weight). Every row
    starts from the checkpoint's own weights (RTN's start: no init)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tfcompile.recipe.build import options_recipe
    from tfcompile.recipe.options import RunOptions

    code = "import json, acc_distill_smollm2 as b; print(json.dumps(b.ROWS))"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2] / "bench",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[row][4] is None  # the distill row starts from the checkpoint
    calib = ("calibrate.data=python-doc",) if "--calib" in rows[row][3] else ()  # only W4A4 NVFP4 calibrates
    run = RunOptions(fmt=fmt, preset="best", settings={"distill": {}}, sets=(*calib, "distill.heldout_tokens=0"))
    assert options_recipe(run).to_dict() == _bench_recipe(fmt, rows[row][3], steps=120)
