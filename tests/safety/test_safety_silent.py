"""Issue 24, case 10 (first part): an option combination that would do nothing of what was
asked is exit 1, not a silent exit 0."""

from __future__ import annotations

import pytest


def test_until_a_skipped_pass_is_refused(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "o"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "--until", "pack", "--skip", "pack")
    assert res.code == 1 and "--until pack" in res.err and "hint: " in res.err, (res.code, res.err)
    assert not out.exists()


def test_a_device_this_machine_lacks_is_refused_even_when_nothing_needs_it(tiny_llama, tmp_path, run_cli):
    import torch

    spec = f"cuda:{torch.cuda.device_count() + 98}"  # none here, with or without a GPU
    out = tmp_path / "o"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "--device", spec)  # data-free RTN
    assert res.code == 1 and f"--device {spec}" in res.err and "hint: " in res.err, (res.code, res.err)
    assert not out.exists()


@pytest.mark.parametrize("how", ["set", "recipe"])
def test_a_fraction_for_an_integer_option_is_refused_not_truncated(how, tmp_path, run_cli):
    if how == "set":
        args = ("--format", "nvfp4", "--set", "calibrate.samples=2.9")
    else:
        (tmp_path / "r.toml").write_text('version = 1\nformat = "nvfp4"\n[passes.calibrate]\nsamples = 2.9\n')
        args = ("--recipe", tmp_path / "r.toml")
    res = run_cli("plan", *args)
    assert res.code == 1 and "calibrate.samples" in res.err and "whole number" in res.err, (res.code, res.err)
    res = run_cli("plan", "--format", "nvfp4", "--set", "calibrate.samples=2.0")  # a whole number, as a float
    assert res.code == 0 and '"samples": 2' in res.out
