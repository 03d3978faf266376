"""Layer-by-layer calibration straight from the memory-mapped checkpoint.

Memory holds one decoder layer's weights plus the calibration activations
(samples x seq_len x hidden in the model dtype: 64 x 512 x 2048 bf16 = 134 MB
for a 1B model), never the whole model, so a model larger than RAM calibrates.

1. The model is built by transformers with every *parameter* on the meta
   device (buffers such as RoPE's inv_freq are computed for real).
2. Parameters outside the decoder layers (embeddings) are bound to zero-copy
   views of the memory-mapped safetensors (a copy only when the dtype differs).
3. Each batch runs through the model's own forward until decoder layer 0,
   which records its inputs (hidden states, and the mask / RoPE tables /
   position ids the model computed) and stops the forward. Using the model's
   forward keeps every architecture's embedding scale, masks and RoPE exact.
4. For each layer in turn: bind its parameters, run it once per batch (the
   same `Recorders` hooks as the whole-model loop observe its Linears and
   attention), replace the batch's hidden states with its outputs, unbind the
   parameters and drop their pages from the resident set.

Without a `solver`, each layer runs once per batch and its outputs, from the
unquantized layer, feed the next (statistics of the original model, as the
whole-model loop gives). With one (an algorithm's layer solver), layer i is
quantized once its statistics are in and run again with its quantized weights,
hooks paused, to make layer i+1's inputs (calibration/propagate.py). The per-group
statistics (calibration/statistics.py) of finished layers (or, propagating, the
solved codes) are spilled to a temporary directory (a 1B model's [K, K] down_proj
second moments alone are 4 GB of float32).
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from tfcompile.calibration.binding import (  # noqa: F401 - Unsupported: raised here, caught by passes/calibrate.py
    Unsupported, bind, fixed_mmap_threshold, skeleton, unbind)
from tfcompile.calibration.datasets import tokens_sha256
from tfcompile.calibration.forward import Silent, calibration_ids, resolve_data
from tfcompile.calibration.layer_resume import LayerCheckpoints
from tfcompile.calibration.propagate import LayerPropagation, LayerSolver
from tfcompile.calibration.recorders import Recorders
from tfcompile.calibration.statistics import SOLVED, STATISTICS, HeldTensors, held
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import broadcast
from tfcompile.dist.partition import mine, rounds
from tfcompile.ir import CalibStats
from tfcompile.families.names import RenamedView
from tfcompile.io.locks import sweep_stale_in, work_dir
from tfcompile.io.oserrors import as_os_error, write_error

# allow-listed name (tests/test_algorithm_names.py): the spill directory's prefix, as released versions
# wrote it and tfcompile/io/locks.py sweeps it
SPILL_PREFIX = "tfcompile-hessians-"


def observe_sequential(model_dir: Path, ckpt, modules: set[str], *, data: str, samples: int,
                       seq_len: int, seed: int, dtype: torch.dtype, kv: bool = False,
                       observer: str = "max", observer_params: dict | None = None,
                       statistics: Mapping[str, Mapping[str, Any]] | None = None,
                       groups: Mapping[str, str] | None = None,
                       batch: int = 4, on_layer=None, all_experts: bool = False,
                       moe_min_tokens: int = 16, world=LOCAL, device: torch.device | str = "cpu",
                       owner: Mapping[str, int] | None = None, progress=None,
                       solver: LayerSolver | None = None, on_final=None,
                       resume: LayerCheckpoints | None = None) -> CalibStats:
    """Same statistics as `forward.observe_input_amax`, computed one decoder layer at a time.

    `ckpt` is the open `Checkpoint`; `on_layer(i, n, seconds)` reports each layer's time and
    `progress` (a pipeline reporter: task/advance) every batch of every layer.
    Raises `Unsupported` before running anything if a parameter has no tensor.
    `device`: where the layer and the activations live (one layer's weights are copied there
    at a time; on the CPU they are the mapped pages themselves). Under torchrun (`world`),
    batch b runs on rank b mod N and the statistics are reduced exactly (calibration.recorders).
    `statistics`, `groups`, `owner`: as `forward.observe_input_amax` (none may need the whole model).
    `solver`: quantize each layer once its statistics are in and feed the next layer its quantized
    outputs (calibration/propagate.py); the stats then hold the solved codes, and no per-group
    statistic (the solver consumed them). A
    solver with `needs_block` (learned rounding) is also handed the layer, its quantized-stream
    inputs and the original model's outputs of the layer (`Block`), which the loop keeps.
    `on_final(model, batches, n_rounds, source)`: called after the last layer with this rank's
    (ids [B, T], the last layer's output [B, T, H], the final norm's input) per batch, e.g. to
    calibrate the MTP layers on them (tfcompile/draft/mtp_calibrate.py).
    `resume`: the solver's answers of an interrupted run's layers are read back, not solved again,
    and each new one is saved (calibration/layer_resume.py)."""
    whole = sorted(n for n in statistics or {} if STATISTICS[n].whole_model)
    if whole:
        raise Unsupported(f"statistic {whole[0]} needs the whole model")
    fixed_mmap_threshold()
    model = skeleton(model_dir)
    model.config.use_cache = False  # layers run one at a time: no KV cache to build
    data, tokenizer = resolve_data(model_dir, model, data, samples, seq_len)  # auto, self -> the real source
    path, layers = find_layers(model)
    propagation = None if solver is None else LayerPropagation(
        solver, model, ckpt, path, dtype, world=world, owner=owner, moe_min_tokens=moe_min_tokens, resume=resume)
    ckpt = RenamedView(ckpt, model)  # the checkpoint under the model's names (Qwen2.5-VL: language_model.)
    _check_layers(model, ckpt, path)
    progress = progress or Silent()
    spec = dict(data=data, samples=samples, seq_len=seq_len, seed=seed, tokenizer=tokenizer, progress=progress)
    if world.is_root:
        ids = _tokens(model_dir, model, ckpt, dtype, path, layers, spec)
    else:  # rank 0 samples or reads the tokens once; the others bind what precedes layer 0
        bind(model, ckpt, dtype, skip=f"{path}.")
        ids = None
    ids = broadcast(world, ids)
    starts = range(0, ids.shape[0], batch)  # batch b: sequences [b*batch, (b+1)*batch)
    my_starts = [starts[b] for b in mine(len(starts), world.rank, world.size)]
    inputs = _catch_inputs(model, layers, ids, batch, starts=my_starts, device=device)
    rec = Recorders(model, modules, observer=observer, observer_params=observer_params, kv=kv,
                    statistics=statistics, groups=groups, all_experts=all_experts, moe_min_tokens=moe_min_tokens,
                    world=world, owner=owner, compute_dtype=dtype)
    rec.begin(ids)
    spill = _Spill()
    # learned rounding (a solver with needs_block): the unquantized model's activations, kept beside
    # the quantized stream as each block's target (one more copy of the activations)
    originals = list(inputs) if propagation is not None and propagation.needs_block else None
    n_rounds = rounds(len(starts), world.size)
    passes = 1 if propagation is None else 2
    progress.task(f"calibrate {len(layers)} layers x {len(starts)} batches", len(layers) * n_rounds * passes)
    try:
        with torch.inference_mode():
            for i, layer in enumerate(layers):
                t0 = time.perf_counter()
                bind(layer, ckpt, dtype, prefix=f"{path}.{i}.", device=device)
                for r in range(n_rounds):  # round r: batches r*N .. r*N+N-1
                    if r < len(inputs):
                        hidden, kwargs = inputs[r]
                        out = _first(layer(hidden, **kwargs))
                        if propagation is None:  # else layer i+1's inputs come from the quantized rerun
                            inputs[r] = (out, kwargs)
                    rec.flush()
                    progress.advance(1, f"layer {i + 1}/{len(layers)}")
                block = None
                if originals is not None:  # the original model's stream: this layer's targets, next inputs
                    with rec.paused():
                        originals = [(_first(layer(h, **kw)), kw) for h, kw in originals]
                    block = propagation.block(i, layer, inputs, [h for h, _ in originals],
                                              batch_ids=mine(len(starts), world.rank, world.size))
                if propagation is None:
                    unbind(layer)
                    ckpt.release()
                    for name, tensors in rec.take().items():
                        spill.put(i, tensors, name)
                else:
                    codes = propagation.solve(i, rec, block)  # a block solver tunes the still-bound layer
                    unbind(layer)
                    ckpt.release()
                    spill.put(i, codes, SOLVED)
                    _rerun(i, layer, inputs, propagation, rec, prefix=f"{path}.{i}.", dtype=dtype, device=device,
                           progress=lambda: progress.advance(n_rounds, f"layer {i + 1}/{len(layers)}, quantized"))
                if on_layer:
                    on_layer(i, len(layers), time.perf_counter() - t0)
            if on_final is not None:
                on_final(model, [(ids[s: s + batch], h) for s, (h, _) in zip(my_starts, inputs)], n_rounds,
                         f"{data}(seed={seed})")
    except BaseException:  # Ctrl-C, SIGTERM, a failed layer: no spill outlives the run
        spill.cleanup()
        raise
    finally:
        rec.remove()
    stats = rec.stats(int(ids.numel()), f"{data}(seed={seed})", model_dir)
    stats = dataclasses.replace(stats, tokens_sha256=tokens_sha256(ids))
    if propagation is not None:  # the spill holds codes: the solver consumed the per-group statistics
        owners = propagation.owners()
        kept = {n: {} if STATISTICS[n].per_group else v for n, v in stats.statistics.items()}
        solved = HeldTensors(spill.files.get(SOLVED, {}), {}, owners if world.distributed else None, world.rank,
                             keep=spill)
        return dataclasses.replace(stats, statistics=kept, solved=solved)
    return dataclasses.replace(stats, statistics={
        n: held(v, {}, world, spill.files.get(n), keep=spill) if STATISTICS[n].per_group else v
        for n, v in stats.statistics.items()})


def _rerun(i: int, layer: nn.Module, inputs: list, propagation: LayerPropagation, rec: Recorders, *, prefix: str,
           dtype: torch.dtype, device, progress) -> None:
    """Layer i bound to its quantized weights, its Linears' inputs quantized as the artifact's
    scheme does (`LayerPropagation.input_hooks`), run on this rank's batches with nothing recorded:
    the outputs replace the inputs (layer i+1's)."""
    bind(layer, propagation.checkpoint, dtype, prefix=prefix, device=device)
    hooks = propagation.input_hooks(i, layer, rec)
    try:
        with rec.paused():
            for r, (hidden, kwargs) in enumerate(inputs):
                inputs[r] = (_first(layer(hidden, **kwargs)), kwargs)
    finally:
        for h in hooks:
            h.remove()
    unbind(layer)
    propagation.done()
    propagation.checkpoint.release()
    progress()


def _tokens(model_dir: Path, model: nn.Module, ckpt, dtype, path: str, layers, spec: dict) -> torch.Tensor:
    """Calibration ids. `self` samples them from the model, so for that the whole model is
    bound to the mapped checkpoint (zero-copy views: the page cache holds the weights,
    not this process's heap) and the layers are unbound again afterwards."""
    if spec["data"] == "self":
        bind(model, ckpt, dtype)
        try:
            with torch.inference_mode():
                return calibration_ids(model_dir, model, **spec)
        finally:
            for layer in layers:
                unbind(layer)
            ckpt.release()
    bind(model, ckpt, dtype, skip=f"{path}.")
    return calibration_ids(model_dir, model, **spec)


def find_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder layer stack: the longest ModuleList whose entries hold parameters."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and any(True for _ in mod[0].parameters()):
            if re.fullmatch(r"(.*\.)?layers", name) and (best is None or len(mod) > len(best[1])):
                best = (name, mod)
    if best is None:
        raise Unsupported("no decoder layer stack (a ModuleList named 'layers')")
    return best


def _check_layers(model: nn.Module, ckpt, path: str) -> None:
    """Every decoder-layer parameter must have its tensor (by name, or fused experts)."""
    names = set(ckpt.names())
    for name, p in model.named_parameters():
        if not name.startswith(path + ".") or name in names:
            continue
        m = re.fullmatch(r"(.*\.experts)\.(gate_up_proj|down_proj)(_bias)?", name)
        leaf = "bias" if m and m.group(3) else "weight"
        if not (m and f"{m.group(1)}.0.down_proj.{leaf}" in names):
            raise Unsupported(f"parameter {name} has no tensor in the checkpoint")


class _Caught(Exception):
    pass


class _Catcher(nn.Module):
    """Stands in for decoder layer 0: records its call and stops the forward."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.calls: list[tuple[torch.Tensor, dict]] = []

    def forward(self, hidden, *args, **kwargs):
        if args:
            raise Unsupported("decoder layer called with positional arguments beyond hidden_states")
        self.calls.append((hidden, kwargs))
        raise _Caught


def _catch_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, batch: int,
                  starts=None, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, dict]]:
    """Per batch of `batch` sequences starting at `starts` (default: all): (hidden states into
    layer 0, its keyword arguments), moved to `device`, where they stay for the layer loop.
    What precedes layer 0 (embeddings, mask, RoPE tables) runs on the CPU."""
    catcher = _Catcher(layers[0])
    layers[0] = catcher
    try:
        with torch.inference_mode():
            for start in range(0, ids.shape[0], batch) if starts is None else starts:
                try:
                    model(input_ids=ids[start: start + batch], use_cache=False)
                except _Caught:
                    continue
                except (RuntimeError, NotImplementedError) as e:  # e.g. a weight left on meta
                    raise Unsupported(f"the forward before decoder layer 0 failed: {e}") from e
                raise Unsupported("the forward never reached decoder layer 0")
    finally:
        layers[0] = catcher.layer
    return [(h.to(device), _to(kw, device)) for h, kw in catcher.calls]


def _to(obj, device):
    """Tensors in nested tuples/lists/dicts moved to `device` (the layer's keyword arguments)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class _Spill:
    """Per-group tensors of finished layers, in a temporary safetensors file per statistic and layer."""

    def __init__(self):
        self.dir: tempfile.TemporaryDirectory | None = None
        self.files: dict[str, dict[str, Path]] = {}  # statistic (or SOLVED) -> group key -> its file

    def put(self, layer: int, tensors: dict[str, torch.Tensor], name: str) -> None:
        if not tensors:
            return
        if self.dir is None:
            # the owner token in the name lets a later run delete the spill of a killed one (io/locks.py)
            sweep_stale_in(Path(tempfile.gettempdir()), SPILL_PREFIX)
            self.dir = work_dir(SPILL_PREFIX)
        f = Path(self.dir.name) / f"{name}-layer{layer}.safetensors"
        label = STATISTICS[name].label if name in STATISTICS else "solved codes"
        try:
            save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, f)
        except Exception as e:  # noqa: BLE001 - an I/O failure (TMPDIR full) is the machine's: exit 1
            cause = as_os_error(e, f)
            if cause is None:
                raise
            raise write_error(f, cause, f"spill {label} to", f"the layer loop spills each finished layer's {label} "
                              f"to TMPDIR ({tempfile.gettempdir()}): point TMPDIR at a file system with room "
                              "(tfcompile plan --estimate gives the spill size per rank)") from None
        self.files.setdefault(name, {}).update({k: f for k in tensors})

    def cleanup(self) -> None:
        if self.dir is not None:
            self.dir.cleanup()
            self.dir, self.files = None, {}
