"""A new calibrated algorithm is one module (issue 25 item 1): registered with the statistics it
needs (`register_algorithm(calibrate=...)`), it is scheduled with its calibration, handed those
statistics and run by pack, with no edit to the quantize pass, the calibrate pass, the IR or pack
(before, the quantize pass kept a table of which algorithm needs which statistics).

The toy ("toy_h"): round to nearest, but it refuses a group whose Hessian it was not given, and
records every group it quantized; its artifact equals plain RTN's tensor for tensor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

import tfcompile.api  # noqa: F401  (registers the passes and the algorithms)
from tfcompile import ir
from tfcompile.calibration.hessian import hessians


def read_tensors(artifact: Path) -> dict:
    out = {}
    for f in sorted(artifact.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture
def toy_h(monkeypatch):
    from tfcompile.passes.quantize.rtn import run_rtn

    seen: list[str] = []

    def run(job, program, source):
        assert job.group.key in hessians(program), f"no Hessian handed to the toy for {job.group.key}"
        seen.append(job.group.key)
        return run_rtn(job, program, source)

    monkeypatch.setitem(ir.ALGORITHMS, "toy_h", ir.Algorithm("toy_h", run, calibrate={"hessian": True}))
    return seen


def test_a_registered_calibrated_algorithm_runs_with_its_statistics(toy_h, tiny_llama_src, tmp_path):
    from tfcompile.api import quantize

    calib = {"calibrate": {"data": "random", "samples": 2, "seq_len": 16}}
    ctx = quantize(tiny_llama_src, tmp_path / "toy", "nvfp4a16",
                   overrides={"quantize": {"algorithm": "toy_h"}, **calib})
    names = ctx.recipe.names()
    assert "calibrate" in names and ctx.recipe.config("calibrate").hessian  # implied by its registration
    groups = {g.key for g in ctx.plan.groups}
    assert groups and set(toy_h) == groups  # pack ran it on every group, each with its Hessian
    rtn = quantize(tiny_llama_src, tmp_path / "rtn", "nvfp4a16")
    a, b = read_tensors(tmp_path / "toy"), read_tensors(tmp_path / "rtn")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert rtn.program.algorithm == "rtn" and ctx.program.algorithm == "toy_h"
