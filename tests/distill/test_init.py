"""`distill.init` (`--init ARTIFACT`): the student starts from another artifact's weights (GPTQ's)."""

from __future__ import annotations

import pytest
import torch
from distill_util import dequantized, manifest

CALIB = ["--calib", "random", "--calib-samples", "4", "--calib-seq-len", "32"]


@pytest.fixture(scope="module")
def gptq_art(tiny_llama_src, tmp_path_factory):
    """A GPTQ nvfp4a16 artifact of the tiny Llama: its weights differ from round-to-nearest's."""
    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("gptq") / "art"
    assert main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", "nvfp4a16", "--algorithm", "gptq",
                 "-q", *CALIB]) == 0
    return out


def test_student_starts_from_the_artifact(tiny_llama_src, gptq_art):
    """Every quantized Linear's master weight is the init artifact's dequantized weight, bit for bit
    (not the checkpoint's: a no-op init fails here)."""
    from tfcompile.api import run_pipeline
    from tfcompile.calibration.forward import load_hf_model
    from tfcompile.distill.init import InitWeights
    from tfcompile.distill.run import _convert
    from tfcompile.recipe.build import build_recipe

    ctx = run_pipeline(tiny_llama_src, None, build_recipe(fmt="nvfp4a16", until="quantize"))
    init = InitWeights.open(gptq_art, ctx.plan)
    student = _convert(load_hf_model(tiny_llama_src, torch.float32), init=init, plan=ctx.plan, program=ctx.program,
                       train="weights", lora_rank=4, lora_alpha=4.0, seed=0, dtype=torch.bfloat16)
    want = dequantized(gptq_art)
    orig = load_hf_model(tiny_llama_src, torch.float32).state_dict()
    assert set(student.linears) == set(want)
    for name, lin in student.linears.items():
        assert torch.equal(lin.weight.detach(), want[name]), name
        assert not torch.equal(lin.weight.detach(), orig[f"{name}.weight"]), name


def test_distill_from_gptq(tiny_llama_src, gptq_art, fast, tmp_path, run_cli):
    """End to end: the manifest names the init artifact by hash, and the run's starting figures are
    the init's, not round-to-nearest's."""
    base = run_cli("distill", tiny_llama_src, "-o", tmp_path / "rtn", "--format", "nvfp4a16", *fast, "--json")
    res = run_cli("distill", tiny_llama_src, "-o", tmp_path / "init", "--format", "nvfp4a16", *fast,
                  "--init", gptq_art, "--json")
    assert base.code == 0 and res.code == 0, res.err
    d = manifest(tmp_path / "init")["distill"]
    assert d["init"]["scheme"] == "nvfp4a16" and len(d["init"]["manifest_sha256"]) == 64
    # recorded only when set: a run without --init records the recipe it always did (artifact bytes)
    cfg = {o: next(p["config"] for p in manifest(tmp_path / o)["recipe"]["passes"] if p["name"] == "distill")
           for o in ("rtn", "init")}
    assert "init" not in cfg["rtn"] and cfg["init"]["init"] == str(gptq_art)
    rtn_before = base.json()["distill"]["heldout"]["before"]["kl_mean"]
    assert d["heldout"]["before"]["kl_mean"] != rtn_before


@pytest.mark.parametrize("fmt,args,msg", [
    ("mxfp4a16", [], "the artifact is nvfp4a16"),
    ("nvfp4a16", ["--mode", "layerwise"], "distill.init goes with distill.mode model"),
])
def test_bad_init_fails_before_training(fmt, args, msg, tiny_llama_src, gptq_art, fast, tmp_path, run_cli):
    res = run_cli("distill", tiny_llama_src, "-o", tmp_path / "out", "--format", fmt, *fast, *args,
                  "--init", gptq_art)
    assert res.code == 1 and msg in res.err and "hint:" in res.err, res.err
    assert not (tmp_path / "out").exists()


def test_not_an_artifact(tiny_llama_src, fast, tmp_path, run_cli):
    res = run_cli("distill", tiny_llama_src, "-o", tmp_path / "out", "--format", "nvfp4a16", *fast,
                  "--init", tiny_llama_src)
    assert res.code == 1 and "not a tfcompile artifact" in res.err and "hint:" in res.err, res.err
