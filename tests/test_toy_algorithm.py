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


CONFIGS = Path(__file__).resolve().parent.parent / "examples" / "configs"


def _toy_cost(monkeypatch, cost):
    """Register "toy_c": RTN's run, the Hessians it asks for, and `cost` (None: no solve cost)."""
    from tfcompile.passes.quantize.rtn import run_rtn

    monkeypatch.setitem(ir.ALGORITHMS, "toy_c", ir.Algorithm("toy_c", run_rtn, calibrate={"hessian": True},
                                                             cost=cost))


def _plan(config: str, devices: str, **quantize) -> dict:
    from tfcompile.estimate.plan import estimate
    from tfcompile.recipe.build import build_recipe

    recipe = build_recipe(fmt="nvfp4a16", overrides={"quantize": {"algorithm": "toy_c", **quantize}})
    return estimate(CONFIGS / config, recipe, devices)


def test_a_registered_cost_is_what_plan_estimate_adds_up(monkeypatch):
    """`register_algorithm(cost=...)` is the whole of an algorithm's part in `plan --estimate` (no
    edit to tfcompile/estimate/): the toy's solve costs one second and 1000 bytes per weight; on one
    H100 pack runs one solve per quantized Linear of Llama-3.1-8B (32 layers x 7), one at a time."""
    calls = []

    def seconds(n, k, gpu, machine, together):
        calls.append((n, k, together))
        return 1.0

    _toy_cost(monkeypatch, ir.SolveCost(seconds, lambda n, k: 1000 * n * k))
    doc = _plan("llama-3.1-8b", "H100")
    pack = doc["passes"]["pack"]
    assert doc["algorithm"] == "toy_c" and doc["model"]["quantized_linears"] == 224
    assert len(calls) == 224 and pack["toy_c_solve_s"] == 224.0 and {t for *_, t in calls} == {1}
    assert pack["device_gb"] == round(1000 * 14336 * 4096 / 1e9, 3)  # the largest: gate/up, down [14336 x 4096]
    assert pack["seconds"] == round(pack["stream_s"] + 224.0, 2)
    assert "toy_c_solve_s" not in doc["passes"]["calibrate"]  # not propagating: pack solves


def test_batched_experts_share_a_sweep_and_no_cost_adds_nothing(monkeypatch):
    """`batches_experts`: a routed expert group's solves run quantize.gptq_expert_batch experts
    (x its members) together; an algorithm that registers no cost adds no solve time."""
    together = set()

    def seconds(n, k, gpu, machine, t):
        together.add(t)
        return 0.5

    _toy_cost(monkeypatch, ir.SolveCost(seconds, lambda n, k: n * k, batches_experts=True))
    doc = _plan("qwen3.5-35b-a3b", "8xH100", gptq_expert_batch=4)
    assert doc["passes"]["pack"]["toy_c_solve_s"] > 0
    assert together == {1, 4, 8}  # dense alone; experts by 4s: down_proj (one member), gate/up (two)
    _toy_cost(monkeypatch, None)
    plain = _plan("qwen3.5-35b-a3b", "8xH100")
    assert not [k for p in plain["passes"].values() for k in p if k.endswith("_solve_s")]
    assert plain["passes"]["pack"]["seconds"] == plain["passes"]["pack"]["stream_s"]
