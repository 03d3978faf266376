"""A calibrated algorithm that needs a statistic the calibration loop does not record yet is one
module (issue 25 item 1): this file alone registers the statistic (`register_statistic`) and an
algorithm that asks for it by name, with no edit to calibration/, tfcompile/ir.py or passes/.

The toy statistic ("toy_sumsq"): per fusion group, the per-input-channel sum of x^2 over every
calibration token, float64 [K], recorded on the group's first member (the members share x). The
oracle is an independent torch computation: transformers' own model over the same token ids, a
forward pre-hook summing x^2 in float64. Both loops must record it (the whole model, and layer by
layer, where it is spilled per finished layer and read back lazily), and the calibrate pass must
hand it to the algorithm, which pack runs on every group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tfcompile.api  # noqa: F401  (registers the passes and the algorithms)
from tfcompile.calibration.record import CALIB as CALIB_FACT
from tfcompile import ir
from tfcompile.calibration.datasets import tokens_sha256
from tfcompile.calibration.forward import calibration_ids, load_hf_model, observe_input_amax
from tfcompile.calibration.sequential import observe_sequential
from tfcompile.calibration.statistics import (STATISTICS, HeldTensors, Recorder, Setup, register_statistic,
                                              result_of)
from tfcompile.io.checkpoint import open_checkpoint

NAME = "toy_sumsq"
CALIB = dict(data="random", samples=6, seq_len=24, seed=3, dtype=torch.float32)


class SumSq(Recorder):
    """Group key -> sum over tokens of x * x per input channel, float64 [K]."""

    def __init__(self, setup: Setup):
        super().__init__()
        self.groups = setup.first_members()  # first member (checkpoint name) -> group key
        self._sum: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        # under torchrun each group's sum is folded on its owner in batch order, as one process adds
        setup.replay.owners.update({f"{NAME}/{k}": r for k, r in setup.owner.items()})
        self._fold = {k: setup.replay.wrap(f"{NAME}/{k}", self._folder(k)) for k in sorted(set(self.groups.values()))}
        in_model = {setup.names.to_model(m): k for m, k in self.groups.items()}
        self.hooks = [mod.register_forward_pre_hook(self._hook(in_model[n]))
                      for n, mod in setup.model.named_modules() if n in in_model]

    def _hook(self, key: str):
        def hook(mod, args):
            if not self.paused:
                self._fold[key](args[0])
        return hook

    def add(self, member: str, x: torch.Tensor) -> None:  # fused experts' inputs (none in this model)
        if member in self.groups and not self.paused:
            self._fold[self.groups[member]](x)

    def _folder(self, key: str):
        def fold(x: torch.Tensor) -> None:
            x = x.detach().reshape(-1, x.shape[-1]).double()
            self._sum[key] = self._sum.get(key, 0) + (x * x).sum(0)
            self._n[key] = self._n.get(key, 0) + x.shape[0]
        return fold

    def rows(self) -> dict[str, int]:
        return dict(self._n)

    def result(self) -> dict[str, torch.Tensor]:
        return dict(self._sum)

    def take(self) -> dict[str, torch.Tensor]:
        out = self.result()
        self._sum.clear()
        self._n.clear()
        return out


@pytest.fixture
def toy_statistic():
    register_statistic(NAME, SumSq, per_group=True, summary=lambda calib: {"toy_groups": len(result_of(calib, NAME))})
    yield
    del STATISTICS[NAME]


def _groups(modules: set[str]) -> dict[str, str]:
    """Every Linear -> its fusion group: q/k/v share one input, gate/up another."""
    fused = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
    out = {}
    for m in sorted(modules, key=lambda m: (m.rsplit(".", 1)[0], list(fused).index(m.rsplit(".", 1)[1])
                                            if m.rsplit(".", 1)[1] in fused else 9)):
        parent, leaf = m.rsplit(".", 1)
        out[m] = f"{parent}.{fused[leaf]}" if leaf in fused else m
    return out


def _oracle(model_dir: Path, groups: dict[str, str]) -> tuple[dict[str, torch.Tensor], str]:
    """Group key -> sum of x^2 per channel of its input, from transformers' model over the same ids."""
    model = load_hf_model(model_dir, torch.float32)
    ids = calibration_ids(model_dir, model, data=CALIB["data"], samples=CALIB["samples"],
                          seq_len=CALIB["seq_len"], seed=CALIB["seed"])
    want: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    first = {}
    for m, key in groups.items():
        first.setdefault(key, m)

    def hook(key):
        def fn(mod, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            want[key] = want.get(key, 0) + (x ** 2).sum(0)
        return fn

    handles = [mods[m].register_forward_pre_hook(hook(k)) for k, m in first.items()]
    with torch.no_grad():
        model(input_ids=ids)
    for h in handles:
        h.remove()
    return want, tokens_sha256(ids)


@pytest.mark.parametrize("loop", ["whole", "sequential"])
def test_both_loops_record_a_registered_statistic(toy_statistic, tiny_llama, loop):
    with open_checkpoint(tiny_llama) as ckpt:
        modules = {n[: -len(".weight")] for n in ckpt.names() if n.endswith("proj.weight")}
        groups = _groups(modules)
        if loop == "whole":
            stats = observe_input_amax(tiny_llama, modules, statistics={NAME: {}}, groups=groups, **CALIB)
        else:
            stats = observe_sequential(tiny_llama, ckpt, modules, statistics={NAME: {}}, groups=groups,
                                       batch=4, **CALIB)
            got = result_of(stats, NAME)
            assert isinstance(got, HeldTensors)  # spilled per finished layer, read back when asked
            got = {k: got[k] for k in got}  # read while the checkpoint is open
    got = result_of(stats, NAME) if loop == "whole" else got
    want, sha = _oracle(tiny_llama, groups)
    assert stats.tokens_sha256 == sha  # the same calibration tokens
    assert len(want) == 8 and set(got) == set(want)  # 2 layers x (qkv, o, gate_up, down)
    for key, w in want.items():
        assert got[key].dtype == torch.float64 and got[key].shape == w.shape
        # measured <= 1e-6: float32 forwards batched differently (one sequence, 4, all 6)
        assert torch.allclose(got[key], w, rtol=1e-5, atol=0), (key, float((got[key] / w - 1).abs().max()))
    assert stats.seconds.get(NAME, {}) == {}  # it reports no time; a statistic that does is summed


@pytest.mark.parametrize("mode", ["whole", "sequential"])
def test_an_algorithm_is_handed_its_new_statistic(toy_statistic, tiny_llama_src, tmp_path, monkeypatch, mode):
    from tfcompile.api import quantize
    from tfcompile.passes.quantize.rtn import run_rtn

    handed: dict[str, torch.Tensor] = {}

    def run(job, program, source):
        handed[job.group.key] = result_of(program, NAME)[job.group.key]  # KeyError: not handed
        return run_rtn(job, program, source)

    monkeypatch.setitem(ir.ALGORITHMS, "toy_sq", ir.Algorithm("toy_sq", run, calibrate={"statistics": (NAME,)}))
    calib = {"data": "random", "samples": 2, "seq_len": 16, "mode": mode}
    ctx = quantize(tiny_llama_src, tmp_path / "toy", "nvfp4a16",
                   overrides={"quantize": {"algorithm": "toy_sq"}, "calibrate": calib})
    assert ctx.recipe.config("calibrate").statistics == (NAME,)  # implied by its registration
    assert ctx.pass_stats["calibrate"]["loop"] == mode and ctx.pass_stats["calibrate"]["toy_groups"] == 8
    groups = {g.key for g in ctx.plan.groups}
    assert groups and set(handed) == groups  # pack ran the toy on every group, each with its statistic
    recorded, k = result_of(ctx[CALIB_FACT], NAME), {g.key: g.members[0].shape[1] for g in ctx.plan.groups}
    for key, got in handed.items():  # the calibrate pass's statistic as recorded, one per group
        assert got.shape == (k[key],) and torch.equal(got, recorded[key])
