"""GPTQ's error propagation in the layer loop (calibration/propagate.py).

Oracle: the whole-model loop (transformers' `from_pretrained` and its own forward) on a
checkpoint whose layer-0 Linears were replaced, on disk, by what the solver returned. With
propagation the layer loop must record layer 1's statistics from exactly those inputs, and
layer 0's from the original model (nothing recorded while a layer is re-run).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tfcompile.calibration.forward import observe_input_amax
from tfcompile.calibration.hessian import NAME as HESSIAN
from tfcompile.calibration.hessian import hessians as hessians_of
from tfcompile.calibration.propagate import rebuilt
from tfcompile.calibration.sequential import observe_sequential
from tfcompile.families.experts import take
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.ir import QuantTarget

CALIB = dict(data="random", samples=6, seq_len=24, seed=3, dtype=torch.bfloat16)


def _coarse(w: torch.Tensor) -> torch.Tensor:
    """A stand-in quantizer, plain torch: each row on a grid of 1/8 of its max (bf16)."""
    s = w.float().abs().amax(1, keepdim=True) / 8
    return (torch.round(w.float() / s) * s).to(torch.bfloat16)


class _Solver:
    """Records the Hessians it is handed; returns every module's `_coarse` weight, no codes."""

    def __init__(self, ckpt, modules: set[str]):
        self.ckpt = ckpt
        self.targets = {m: QuantTarget(m, f"{m}.weight", None, None, tuple(ckpt.info(f"{m}.weight").shape))
                        for m in modules}
        self.calls: list[tuple[set[str], dict]] = []

    def __call__(self, modules, statistics, owned):
        self.calls.append((set(modules), dict(statistics.get(HESSIAN, {}))))
        return {}, {m: _coarse(self.ckpt.get(f"{m}.weight")) for m in sorted(modules) if owned(m)}


def _groups(modules: set[str]) -> dict[str, str]:
    return {m: m for m in modules if m.rsplit(".", 1)[1] in ("q_proj", "o_proj", "gate_proj", "down_proj")}



def _layer0_coarse(src, tmp_path, modules):
    """The oracle checkpoint: a copy of `src` with layer 0's Linears replaced by the solver's weights."""
    edited = tmp_path / "edited"
    shutil.copytree(src, edited)
    tensors = load_file(edited / "model.safetensors")
    for m in modules:
        if ".layers.0." in m:
            tensors[f"{m}.weight"] = _coarse(tensors[f"{m}.weight"])
    save_file(tensors, edited / "model.safetensors", metadata={"format": "pt"})
    return edited

def test_layer_one_is_calibrated_on_layer_zero_as_quantized(tiny_llama, tmp_path):
    with open_checkpoint(tiny_llama) as ckpt:
        modules = {n[: -len(".weight")] for n in ckpt.names() if n.endswith("proj.weight")}
        groups = _groups(modules)
        solver = _Solver(ckpt, modules)
        seq = observe_sequential(tiny_llama, ckpt, modules, batch=4, statistics={HESSIAN: {}}, groups=groups, solver=solver,
                                 **CALIB)
    # the oracle checkpoint: layer 0's Linears replaced by the solver's weights
    edited = _layer0_coarse(tiny_llama, tmp_path, modules)
    original = observe_input_amax(tiny_llama, modules, statistics={HESSIAN: {}}, groups=groups, **CALIB)
    quantized0 = observe_input_amax(edited, modules, statistics={HESSIAN: {}}, groups=groups, **CALIB)

    assert [sorted(m) for m, _ in solver.calls] == [sorted(m for m in modules if f".layers.{i}." in m)
                                                    for i in (0, 1)]
    hessians = {k: h for _, hs in solver.calls for k, h in hs.items()}
    assert set(hessians) == set(groups) and not hessians_of(seq)  # solved: none left for pack
    for key, h in hessians.items():
        want, other = (original, quantized0) if ".layers.0." in key else (quantized0, original)
        scale = float(hessians_of(want)[key].abs().max())
        assert float((h - hessians_of(want)[key]).abs().max()) <= 1e-5 * scale, key  # measured <= 4e-7
        if ".layers.1." in key:  # the check can fail: layer 0's quantization moved layer 1's inputs
            assert float((hessians_of(other)[key] - hessians_of(want)[key]).abs().max()) > 1e-3 * scale, key
    for m in modules:  # the amax of layer 1's inputs too; no re-run was recorded (layer 0 = original)
        want = original if ".layers.0." in m else quantized0
        assert seq.input_amax[m] == pytest.approx(want.input_amax[m], rel=1e-3), m
    assert seq.tokens == original.tokens


@pytest.mark.parametrize("transposed", [False, True])
def test_rebuilt_writes_each_slice_where_take_reads_it(transposed):
    """One fused expert tensor [E, 2I, H] (or [E, H, 2I] transposed: GPT-OSS), gate and up rows of
    two of its experts replaced (interleaved, GPT-OSS style: gate the even rows, up the odd):
    `take` reads back exactly the new weights and the rest of the tensor is the source's."""
    g = torch.Generator().manual_seed(0)
    e, inter, hidden = 3, 4, 6
    fused = torch.randn(e, 2 * inter, hidden, generator=g).to(torch.bfloat16)
    if transposed:
        fused = fused.transpose(1, 2).contiguous()

    class Ckpt:
        def get(self, name):
            assert name == "experts.gate_up_proj"
            return fused

    rows = {"gate": (0, 2 * inter, 2), "up": (1, 2 * inter, 2)}
    targets, weights = {}, {}
    for expert in (0, 2):
        for kind, r in rows.items():
            m = f"experts.{expert}.{kind}_proj"
            n = len(range(*r))
            targets[m] = QuantTarget(m, "experts.gate_up_proj", expert, r, (n, hidden), transposed=transposed)
            weights[m] = torch.randn(n, hidden, generator=g)
    out = rebuilt(weights, targets, Ckpt(), torch.bfloat16)
    assert list(out) == ["experts.gate_up_proj"] and out["experts.gate_up_proj"].dtype == torch.bfloat16
    new = out["experts.gate_up_proj"]
    touched = torch.zeros_like(new, dtype=torch.bool)
    for m, t in targets.items():
        assert torch.equal(take(new, t.expert, t.rows, transposed), weights[m].to(torch.bfloat16)), m
        mark = touched[t.expert].T if transposed else touched[t.expert]
        mark[slice(*t.rows)] = True
    assert torch.equal(new[~touched], fused[~touched])  # nothing else written
    assert touched[1].sum() == 0 and touched[0].all()  # expert 1 untouched; gate + up cover expert 0


def _act_grid(x: torch.Tensor, amax: float) -> torch.Tensor:
    """A stand-in activation quantizer, plain torch: x on 9 levels of amax / 4, clipped at amax."""
    s = amax / 4
    return (torch.round(x / s).clamp(-4, 4) * s).to(x.dtype)


class _ActSolver(_Solver):
    """`_Solver` that also quantizes each solved module's input with `_act_grid` at its own amax."""

    def __init__(self, ckpt, modules):
        super().__init__(ckpt, modules)
        self.amax_seen: dict[str, float] = {}

    def input_quantizers(self, amax):
        self.amax_seen.update(amax)
        others = {m: torch.zeros_like for m in self.targets if m not in amax}  # must not be applied
        return {**{m: (lambda x, a=a: _act_grid(x, a)) for m, a in amax.items()}, **others}


def test_inputs_of_the_rerun_are_quantized_as_the_solver_says(tiny_llama, tmp_path):
    """Oracle by hand: transformers' model with layer 0's weights replaced on disk, a pre-hook
    quantizing each layer-0 Linear's input with its amax from the original model, and max |x| of
    layer 1's inputs taken over the same tokens, one sequence at a time."""
    from tfcompile.calibration.forward import calibration_ids, load_hf_model
    calib = dict(CALIB, dtype=torch.float32)  # no rounding-boundary flips between batched and one-by-one
    with open_checkpoint(tiny_llama) as ckpt:
        modules = {n[: -len(".weight")] for n in ckpt.names() if n.endswith("proj.weight")}
        solver = _ActSolver(ckpt, modules)
        seq = observe_sequential(tiny_llama, ckpt, modules, batch=4, solver=solver, **calib)
    edited = _layer0_coarse(tiny_llama, tmp_path, modules)
    original = observe_input_amax(tiny_llama, modules, **calib)
    weights_only = observe_input_amax(edited, modules, **calib)  # the prefix's weights quantized, not its inputs

    model = load_hf_model(edited, torch.float32)
    ids = calibration_ids(edited, model, data="random", samples=6, seq_len=24, seed=3)
    want, hooks = {}, []
    for name, mod in model.named_modules():
        if name in modules and ".layers.0." in name:
            a = original.input_amax[name]
            hooks.append(mod.register_forward_pre_hook(lambda m, args, a=a: (_act_grid(args[0], a),)))
        elif name in modules:
            hooks.append(mod.register_forward_pre_hook(
                lambda m, args, n=name: want.__setitem__(n, max(want.get(n, 0.0), float(args[0].abs().max())))))
    with torch.inference_mode():
        for row in ids:
            model(input_ids=row[None])
    for h in hooks:
        h.remove()

    layer0 = {m for m in modules if ".layers.0." in m}
    assert set(want) == modules - layer0
    for m in layer0:  # the rerun of layer 0 used the amax observed on the original model
        assert solver.amax_seen[m] == pytest.approx(original.input_amax[m], rel=1e-6), m
    for m, v in want.items():
        assert seq.input_amax[m] == pytest.approx(v, rel=1e-4), m
    # the check can fail: quantizing layer 0's inputs moved layer 1's amax beyond the weights alone
    moved = [m for m in want if abs(weights_only.input_amax[m] - want[m]) > 1e-2 * want[m]]
    assert len(moved) >= 3, {m: (weights_only.input_amax[m], want[m]) for m in want}
    assert all(abs(original.input_amax[m] - want[m]) > 1e-3 * want[m] for m in want)


def test_w4a4_rtn_observes_its_input_scales_through_the_quantized_layers(tiny_llama, tmp_path, run_cli):
    """calibrate.propagate with RTN and static input scales (nvfp4): the weights are pack's RTN either
    way (byte for byte), layer 0's input scales come from the original model either way, and layer 1's
    from layer 0 run quantized (weights and inputs), so they move; the artifact verifies."""
    outs = {}
    for prop in ("true", "false"):
        out = tmp_path / prop
        res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4", "--calib", "random",
                      "--calib-samples", "4", "--calib-seq-len", "32", "--json", "--set", f"calibrate.propagate={prop}",
                      "--set", "quantize.scale_search=none")  # RTN's max-based scales both ways
        assert res.code == 0, res.err
        assert res.json()["passes"]["calibrate"]["loop"] == "sequential"
        assert run_cli("verify", out).code == 0
        outs[prop] = load_file(out / "model.safetensors")
    prop, flat = outs["true"], outs["false"]
    assert set(prop) == set(flat)
    scales = [k for k in prop if k.endswith("input_global_scale")]
    assert scales and all(torch.equal(prop[k], flat[k]) for k in prop if k not in scales)
    assert all(torch.equal(prop[k], flat[k]) for k in scales if ".layers.0." in k)
    moved = [k for k in scales if ".layers.1." in k and not torch.equal(prop[k], flat[k])]
    assert len(moved) >= 3, moved  # q/k/v share an input, so do gate/up: at least 3 distinct inputs of 4
