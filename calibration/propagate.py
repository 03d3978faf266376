"""Error propagation in the layer-by-layer loop: an algorithm's layer solver quantizes each decoder
layer as soon as its statistics are in, and the next layer is calibrated on its quantized outputs
(`calibrate.propagate`, default off; or always, for a solver registered with loop="always").

One pass of the unquantized model gives every layer statistics of the *original* activations, so
a solve cannot compensate the error of the layers before it. The solver's paper and
llm-compressor's sequential pipeline (`propagate_error`) instead feed layer i+1 what layer i
computes once quantized. The layer loop (calibration/sequential.py), per decoder layer i:

1. runs layer i on every batch with the hooks recording (registered statistics, amax, KV), as without;
2. `LayerPropagation.solve`: layer i's groups are quantized by the `LayerSolver` the calibrate
   pass hands in (the scheduled algorithm's, `tfcompile.ir.register_layer_solver`; it gets the
   layer's per-group statistics by name, calibration/statistics.py), each on the rank that owns
   the group's statistics (as pack would compute it), and the dequantized weights (model dtype)
   are shared with every rank;
3. rebinds layer i to those weights (`Overrides` over the checkpoint) and runs it again on every
   batch with the hooks paused (`Recorders.paused`): its outputs are layer i+1's inputs.

Static activation scales (W4A4 nvfp4, fp8-static): in step 3 each of layer i's quantized Linears
also sees its input fake-quantized with the static scale its observed amax gives (the solver's
`input_quantizers`: the fused group's max, stored as pack stores it), as the engine runs the
layer; so every later layer's amax, statistics and solve see what the artifact computes, as in
llm-compressor's sequential pipeline, which calibrates with quantization enabled. Dynamic kinds
(mxfp4, fp8-token) are fake-quantized too. Step 1 still runs layer i with its original weights
and inputs (the solve needs them): its own later Linears (o_proj, down_proj) observe inputs the
quantized earlier Linears of the same layer did not make. A Linear with no module of its own
(fused experts) or no observed token is left unquantized in step 3.

A solver may keep no codes (round to nearest: pack's gives the same), only its effect on the
statistics of the layers after it (their static input scales). What a solve produced is kept,
not the statistics it consumed: the packed element codes of each group's members
(`QTensor.data`, concatenated along the rows), spilled per layer (`CalibStats.solved`); pack
re-derives the same scales and writes those codes, so the artifact holds exactly the values
layer i+1 was calibrated on. Cost: a second forward of each layer, and the solves move from
pack into this loop. docs/design.md "Calibration" gives the algorithms that register one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from tfcompile.dist import LOCAL
from tfcompile.dist.collect import share_tensors
from tfcompile.calibration.recorders import Recorders
from tfcompile.families.experts import module_layout, rows_in_gate_up
from tfcompile.families.names import NameMap, RenamedView
from tfcompile.calibration.layer_resume import LayerCheckpoints
from tfcompile.ir import QuantTarget


class LayerSolver(Protocol):
    """Quantizes one decoder layer's groups (built by the calibrate pass from the recipe)."""

    targets: Mapping[str, QuantTarget]  # quantized module (checkpoint name) -> its target

    def __call__(self, modules: set[str], statistics: Mapping[str, Mapping[str, torch.Tensor]],
                 owned: Callable[[str], bool]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """For the groups whose first member is in `modules` and `owned(key)`, given the layer's
        per-group statistics (name -> group key -> tensor, calibration/statistics.py): (group key ->
        packed codes of its solved members, concatenated on dim 0, for the groups it solved;
        module -> its dequantized weight [N, K] in the model dtype, for every group)."""
        ...

    # optional: input_quantizers(amax: module -> observed input amax) -> {module: x -> fake-quantized x},
    # for the modules whose inputs the artifact quantizes (static kinds: only those with an amax)
    # optional: record(i) -> JSON-able dict of what the solver noted about layer i (kept with its answer
    # under calibrate.resume_dir) and restore(i, record), its inverse on resume


@dataclass(frozen=True)
class Slot:
    """Where a quantized module's weight [N, K] lives among its layer's parameters: the whole
    parameter `param`, or one expert's slice of a fused 3-D expert parameter (transformers 5:
    tfcompile/families/experts.py), read as `take(param, expert, rows, transposed)`."""
    param: str
    expert: int | None = None
    rows: tuple[int, int, int] | None = None
    transposed: bool = False

    def view(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The weight's [N, K] view into `params[self.param]` (writable: no copy)."""
        t = params[self.param]
        if self.expert is not None:
            t = t[self.expert]
        if self.transposed:
            t = t.T
        return t if self.rows is None else t[slice(*self.rows)]


@dataclass
class Block:
    """What a solver with `needs_block` (learned rounding: passes/quantize/signround.py) is handed
    for decoder layer `index`: the layer, still bound to the original weights; each calibration
    batch's input as the quantized layers before it made it ([(hidden, kwargs)], on the loop's
    device); the original model's output of this layer per batch (`targets`); and quantized
    module (checkpoint name) -> where its weight lives inside the layer (`Slot`: a whole
    parameter, or an expert's slice of a fused expert parameter). Under torchrun a rank holds only
    its batches: `batch_ids` are their global numbers (None: 0, 1, ... in one process) and `world`
    the ranks that hold the others."""
    index: int
    layer: torch.nn.Module
    inputs: list
    targets: list
    slots: dict[str, Slot]
    batch_ids: list[int] | None = None
    world: Any = LOCAL


class Overrides:
    """A checkpoint (`names`, `get`, `release`) whose tensors in `tensors` are replaced."""

    def __init__(self, ckpt):
        self._ckpt = ckpt
        self.tensors: dict[str, torch.Tensor] = {}

    def names(self) -> list[str]:
        return self._ckpt.names()

    def get(self, name: str) -> torch.Tensor:
        t = self.tensors.get(name)
        return self._ckpt.get(name) if t is None else t

    def release(self) -> None:
        self._ckpt.release()


class LayerPropagation:
    """The per-layer solve and rebinding of the layer loop (module docstring)."""

    def __init__(self, solver: LayerSolver, model: torch.nn.Module, ckpt, path: str, dtype: torch.dtype, *,
                 world=LOCAL, owner: Mapping[str, int] | None = None, moe_min_tokens: int = 0,
                 resume: LayerCheckpoints | None = None):
        unsupported = sorted(m for m, t in solver.targets.items() if t.parts)
        if unsupported:  # gathered rows of an engine view have no one source tensor to replace
            raise ValueError(f"calibrate.propagate cannot rebind layout-view Linears, e.g. {unsupported[0]}")
        self.solver, self.dtype, self.world, self.min_tokens = solver, dtype, world, moe_min_tokens
        self.resume = resume  # calibrate.resume_dir: layers solved by an earlier, interrupted run
        self.owner = dict(owner or {})
        self.view = Overrides(ckpt)
        self.checkpoint = RenamedView(self.view, model)  # what the layer is rebound from
        names = self.names = NameMap(model)
        self.path = path
        pattern = re.compile(re.escape(path) + r"\.(\d+)\.")
        self.layer_of: dict[str, int] = {}
        for module in solver.targets:
            m = pattern.match(names.to_model(module))
            if m:
                self.layer_of[module] = int(m.group(1))
        self.solved: list[str] = []  # group keys solved here (this rank's)

    @property
    def needs_block(self) -> bool:
        """The solver tunes against the layer's outputs (`Block`): the loop keeps the original stream."""
        return bool(getattr(self.solver, "needs_block", False))

    def block(self, i: int, layer: torch.nn.Module, inputs: list, targets: list,
              batch_ids: list[int] | None = None) -> Block:
        """Layer i's `Block` (the layer bound to its original weights); batch_ids: the global
        numbers of this rank's batches (None: one process holds them all)."""
        prefix = f"{self.path}.{i}."
        params = {n: tuple(p.shape) for n, p in layer.named_parameters()}
        slots = {}
        for module, layer_i in self.layer_of.items():
            t = self.solver.targets[module]
            if layer_i != i:
                continue
            name = self.names.to_model(t.source)
            if (t.expert is None and t.rows is None and not t.transposed and name.startswith(prefix)
                    and params.get(name[len(prefix):]) == tuple(t.shape)):  # a whole parameter
                slots[module] = Slot(name[len(prefix):])
            elif (slot := _expert_slot(layer, self.names.to_model(module), prefix, t.shape)) is not None:
                slots[module] = slot
        return Block(i, layer, inputs, targets, slots, batch_ids, self.world)

    def solve(self, i: int, rec: Recorders, block: Block | None = None) -> dict[str, torch.Tensor]:
        """Layer i's statistics are complete: quantize its groups, share the weights, and point
        the checkpoint view at them. Returns the codes to keep (this rank's solves)."""
        statistics = rec.take(self.min_tokens)  # routed experts below min_tokens: none (their groups: RTN)
        modules = {m for m, layer in self.layer_of.items() if layer == i}
        rank = self.world.rank
        owned = lambda key: self.owner.get(key, rank) == rank  # noqa: E731
        saved = self.resume.load(i) if self.resume is not None else None
        if saved is not None:  # solved before the run was interrupted: the same answer, not solved again
            codes, weights, record = saved
            if hasattr(self.solver, "restore"):
                self.solver.restore(i, record)
        else:
            codes, weights = (self.solver(modules, statistics, owned) if block is None
                              else self.solver(modules, statistics, owned, block=block))
            if self.resume is not None:
                record = self.solver.record(i) if hasattr(self.solver, "record") else {}
                self.resume.save(i, codes, weights, record)
        self.solved += sorted(codes)
        weights = share_tensors(self.world, weights, f"propagate/{i}")
        self.view.tensors = rebuilt(weights, self.solver.targets, self.view, self.dtype)
        return codes

    def input_hooks(self, i: int, layer: torch.nn.Module, rec: Recorders) -> list:
        """Forward pre-hooks on layer i's quantized Linears that fake-quantize their inputs as the
        artifact's scheme does (its static scales from the amax observed so far); remove them after
        the rerun. None installed when the solver quantizes no input (weight-only schemes)."""
        make = getattr(self.solver, "input_quantizers", None)
        modules = {m for m, layer_i in self.layer_of.items() if layer_i == i}
        if make is None or not modules:
            return []
        fns = make(rec.amax_now(modules, f"layer{i}"))
        prefix = f"{self.path}.{i}."
        # the solver may answer for other layers' modules too (dynamic kinds need no amax): layer i's only
        by_name = {self.names.to_model(m)[len(prefix):]: fn for m, fn in fns.items() if m in modules}
        hooks = []
        for name, mod in layer.named_modules():
            fn = by_name.get(name)
            if fn is not None:
                hooks.append(mod.register_forward_pre_hook(_quantizing(fn)))
        return hooks

    def done(self) -> None:
        """Layer i's rerun is over: the checkpoint view is the checkpoint again."""
        self.view.tensors = {}

    def owners(self) -> dict[str, int]:
        """Group key -> the rank holding its codes, every rank's solves (collective under torchrun)."""
        out = {}
        for r, keys in enumerate(self.world.all_objects("propagate/solved", self.solved)):
            out.update(dict.fromkeys(keys, r))
        return dict(sorted(out.items()))


def _expert_slot(layer: torch.nn.Module, module: str, prefix: str, shape: tuple[int, int]) -> Slot | None:
    """The fused-parameter slot of per-expert Linear `module` (model name, e.g.
    `{prefix}mlp.experts.3.up_proj`) when the layer holds its experts fused; None otherwise."""
    m = _EXPERT_LINEAR.match(module[len(prefix):]) if module.startswith(prefix) else None
    if m is None:
        return None
    try:
        mod = layer.get_submodule(m["parent"])
    except AttributeError:
        return None
    fused = getattr(mod, "gate_up_proj", None)
    if not isinstance(fused, torch.Tensor) or fused.dim() != 3:
        return None
    layout, proj = module_layout(mod), m["proj"]
    slot = Slot(f"{m['parent']}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}", int(m["e"]),
                rows_in_gate_up(proj, shape[0], layout), layout.transposed)
    return slot if tuple(slot.view(dict(layer.named_parameters())).shape) == tuple(shape) else None


_EXPERT_LINEAR = re.compile(r"^(?P<parent>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)$")


def _quantizing(fn):
    def hook(mod, args):
        return (fn(args[0]),) + tuple(args[1:])
    return hook


def rebuilt(weights: Mapping[str, torch.Tensor], targets: Mapping[str, QuantTarget], ckpt,
            dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Source tensor name -> the tensor with every target's weight replaced by `weights`.

    A whole tensor is the weight itself; a slice (one expert of a fused tensor, gate or up
    rows, a transposed layout: tfcompile/families/experts.py `take`) is written into a copy
    of its source tensor, in the model dtype."""
    out: dict[str, torch.Tensor] = {}
    for module in sorted(weights):
        t, w = targets[module], weights[module].to(dtype)
        if t.expert is None and t.rows is None and not t.transposed:
            out[t.source] = w
            continue
        if t.source not in out:
            out[t.source] = ckpt.get(t.source).to(dtype=dtype, copy=True)
        view = out[t.source]
        if t.expert is not None:
            view = view[t.expert]
        if t.transposed:
            view = view.T
        if t.rows is not None:
            view = view[slice(*t.rows)]
        view.copy_(w)
    return out
