"""`tfcompile distill --init gptq` (tfcompile/cli/distill_start.py): one command builds the GPTQ start
and distills from it, writing what the two commands (`quantize --algorithm gptq`, `distill --init A`)
write; and what `distill --preset best` (schemes.DISTILL_PRESETS) names (RTN's start, since 2026-12-06)."""

from __future__ import annotations

import hashlib

import pytest
from distill_util import manifest

from tfcompile.errors import RecipeError
from tfcompile.recipe.build import _parse_value, build_recipe, options_recipe
from tfcompile.recipe.options import RunOptions
from tfcompile.schemes import DISTILL_PRESETS, PRESETS, preset_sets

CALIB = ["--calib", "random", "--calib-samples", "4", "--calib-seq-len", "32"]


def _files(out):
    """The artifact's tensor files, name -> bytes (the manifest aside: it records the recipe)."""
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}


def _distill_cfg(out) -> dict:
    return next(p["config"] for p in manifest(out)["recipe"]["passes"] if p["name"] == "distill")


def test_one_command_writes_what_the_two_commands_write(tiny_llama_src, fast, tmp_path, run_cli):
    """The start is the run's own recipe with GPTQ: its manifest is the two-command start's, byte for
    byte, and the distilled tensors are the same; the recipe records `init: gptq`, not a path."""
    two_start = tmp_path / "gptq"
    assert run_cli("quantize", tiny_llama_src, "-o", two_start, "--format", "nvfp4a16", "--algorithm", "gptq",
                   "-q", *CALIB).code == 0
    # the weight-only distillation itself calibrates nothing: the calibration options are the start's
    two = run_cli("distill", tiny_llama_src, "-o", tmp_path / "two", "--format", "nvfp4a16", *fast,
                  "--init", two_start, "-q")
    one = run_cli("distill", tiny_llama_src, "-o", tmp_path / "one", "--format", "nvfp4a16", *fast, *CALIB,
                  "--init", "gptq", "--json")
    assert two.code == 0 and one.code == 0, one.err
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    start_sha = hashlib.sha256((two_start / "tfcompile" / "manifest.json").read_bytes()).hexdigest()
    assert manifest(tmp_path / "one")["distill"]["init"]["manifest_sha256"] == start_sha
    assert _distill_cfg(tmp_path / "one")["init"] == "gptq" and "init_artifact" not in _distill_cfg(tmp_path / "one")
    start = one.json()["start"]
    assert start["init"] == "gptq" and start["artifact"] is None and not start["reused"]  # a work folder, removed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tfcompile-distill-")]


def test_resume_dir_keeps_the_start_and_a_rerun_reuses_it(tiny_llama_src, fast, tmp_path, run_cli):
    args = ["--format", "nvfp4a16", *fast, *CALIB, "--init", "gptq", "--resume-dir", tmp_path / "r", "--json"]
    first = run_cli("distill", tiny_llama_src, "-o", tmp_path / "a", *args)
    assert first.code == 0, first.err
    kept = tmp_path / "r" / "init-gptq" / "artifact"
    assert first.json()["start"]["artifact"] == str(kept) and (kept / "tfcompile" / "manifest.json").is_file()
    again = run_cli("distill", tiny_llama_src, "-o", tmp_path / "b", *args)
    assert again.code == 0 and again.json()["start"]["reused"], again.err
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    # another start recipe (a different damp) is refused in that folder, not silently reused
    other = run_cli("distill", tiny_llama_src, "-o", tmp_path / "c", *args, "--set", "quantize.gptq_damp=0.05")
    assert other.code == 1 and "holds another run" in other.err and "hint:" in other.err, other.err


def test_a_bad_distillation_fails_before_the_start_is_built(tiny_llama_src, fast, tmp_path, run_cli):
    """--algorithm gptq on the distillation itself is refused before minutes of GPTQ, with nothing written."""
    res = run_cli("distill", tiny_llama_src, "-o", tmp_path / "out", "--format", "nvfp4a16", *fast, *CALIB,
                  "--init", "gptq", "--algorithm", "gptq")
    assert res.code == 1 and "distill trains from round-to-nearest weights" in res.err and "hint:" in res.err
    assert "building the start artifact" not in res.err and sorted(p.name for p in tmp_path.iterdir()) == []


def test_init_gptq_without_the_command_is_refused(tiny_llama_src, fast, tmp_path):
    """The library's run_pipeline does not build the start: the distill pass names the way out."""
    from tfcompile.api import run_pipeline

    recipe = build_recipe(fmt="nvfp4a16", overrides={"distill": {"init": "gptq", "steps": 1}})
    with pytest.raises(RecipeError, match="distill.init gptq: the start artifact is built by `tfcompile distill`, and this run has none"):
        run_pipeline(tiny_llama_src, tmp_path / "out", recipe)
    assert not (tmp_path / "out").exists()


def _values(recipe) -> dict:
    return {e.name: vars(e.config) for e in recipe.passes}


@pytest.mark.parametrize("fmt", sorted(DISTILL_PRESETS["best"]))
def test_distill_preset_is_the_distillation_and_its_start(fmt):
    """`distill --preset best` takes DISTILL_PRESETS (the measured schedule, from the checkpoint's own
    weights: no init, RTN); `quantize --preset best` is unchanged (GPTQ)."""
    run = RunOptions(fmt=fmt, preset="best", settings={"distill": {}})
    values = _values(options_recipe(run))
    for item in preset_sets("best", fmt, distill=True):
        (name, field), raw = item.split("=", 1)[0].split("."), item.split("=", 1)[1]
        if name in values:  # calibrate: scheduled where the format calibrates (nvfp4's activations)
            assert values[name][field] == _parse_value(raw), item
    assert values["distill"]["steps"] == 120 and values["quantize"]["algorithm"] == "rtn"
    assert values["distill"]["init"] == ""  # RTN's start for every format (docs/accuracy.md, 2026-12-06)
    assert _values(build_recipe(fmt=fmt, preset="best"))["quantize"]["algorithm"] == "gptq"  # PRESETS
    assert set(DISTILL_PRESETS) == set(PRESETS)
