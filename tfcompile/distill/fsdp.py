"""The student sharded over the ranks with FSDP2 (`distill.sharding fsdp`; docs/distributed.md).

- Units: each decoder layer is one `fully_shard` unit, the rest of the model (embeddings, final
  norm, lm_head) the root's. A layer holds whole fusion groups (q/k/v, gate/up), so the members
  that share an NVFP4 global scale (student.py `GroupState`) are unsharded together, and the
  scale is computed from full weights, as on one process. Each parameter is split along dim 0
  (torch.chunk: rank r holds rows [r*ceil(N/n), ...)); buffers (RoPE tables, the scales mode's
  block maxima) stay whole on every rank.
- Training: forward and backward all-gather a unit's parameters (a copy: exact), the gradients
  are reduce-scattered with the average (gloo: a sum then a division by N; with N = 2 that is
  (a + b) / 2, exactly one process's a/2 + b/2), and the optimizer steps each rank's shards (it is
  built after `shard`, from the DTensor parameters fully_shard installed). Every micro-batch
  reduce-scatters (no unsharded gradients are kept across micro-batches: bounded memory).
- Checkpoints hold full tensors (`full`, gathered to the CPU), the same file as one process or
  DDP writes; resuming scatters them back (`placed_like`).
- Export: `Holder` unshards one unit at a time while `Student.export` computes its tensors.
- The online teacher is sharded the same way (forward only); run.py decides what is sharded.
- The clipping norm's row sums (`squares_by_row`) are gathered whole, so its bits do not
  depend on the split (train.py `_clip`).
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

from tfcompile.calibration.sequential import find_layers
from tfcompile.distill.memory import Counts, fits, optimizer_states, per_rank_bytes


def is_sharded(t) -> bool:
    return type(t).__name__ == "DTensor"  # no torch.distributed.tensor import on one process


def counts(student, teacher: nn.Module, cfg) -> Counts:
    """The run's element counts (memory.py) from the built student and teacher."""
    trained = sum(p.numel() for _, p in student.parameters())
    total = sum(p.numel() for p in student.model.parameters())
    layers = [_own_params(student.model, u) for u in _units(student.model)[0]]
    big = max(layers, key=lambda ps: sum(p.numel() for p in ps))
    root = _own_params(student.model, None)
    freed = cfg.teacher == "cache" and not cfg.heldout_tokens  # the teacher leaves before training
    return Counts(trained=trained, frozen=total - trained,
                  teacher=0 if freed else sum(p.numel() for p in teacher.parameters()),
                  layer=sum(p.numel() for p in big), layer_trained=sum(p.numel() for p in big if p.requires_grad),
                  root=sum(p.numel() for p in root), root_trained=sum(p.numel() for p in root if p.requires_grad),
                  states=optimizer_states(cfg.optimizer, cfg.momentum), shard_teacher=cfg.teacher == "online")


def choose(cfg, world, device: torch.device, c: Counts | None) -> str:
    """"ddp" or "fsdp" for this run, the same on every rank. auto: fsdp when the DDP student does
    not fit one device (its memory x memory.HEADROOM), on any rank (`c` is needed for auto only)."""
    if not world.distributed:
        return "ddp"  # one process: nothing to replicate or shard
    if cfg.sharding != "auto":
        return cfg.sharding
    need = per_rank_bytes(c, "ddp", world.size)["total"]
    mine = "ddp" if fits(need, capacity(device, world)) else "fsdp"
    return "fsdp" if "fsdp" in world.all_objects("distill sharding", mine) else "ddp"


def capacity(device: torch.device, world) -> int:
    """Bytes one rank may fill: its GPU's memory, or its share of this node's RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // max(1, world.local_size)


def shard(model: nn.Module, world, device: torch.device,
          prepare: Callable[[nn.Module, str], None] | None = None) -> list[nn.Module]:
    """fully_shard every decoder layer, then the root; returns the units (layers, then root).
    `prepare(unit, prefix)` is called just before a unit is sharded (lazy.py builds it then);
    prefix: the unit's module name and a dot, "" for the root."""
    # lazy: torch.distributed's FSDP2 and device mesh, only under torchrun
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world.size,))
    layers, path = _units(model)
    for i, layer in enumerate(layers):
        if prepare:
            prepare(layer, f"{path}.{i}.")
        fully_shard(layer, mesh=mesh)
    if prepare:
        prepare(model, "")
    fully_shard(model, mesh=mesh)
    return [*layers, model]


def reshard(units: list[nn.Module] | None) -> None:
    """Reshard every unit after forwards without gradients (the held-out figures). FSDP2 leaves the
    root unsharded after its forward; left so by a no_grad forward, its trained parameters (the
    unquantized tensors: embeddings, final norm, lm_head) got no gradient in the next step."""
    for unit in units or ():
        unit.reshard()


class Holder:
    """Keeps one FSDP unit unsharded at a time: `hold(module)` unshards the unit that owns
    `module` (resharding the one held before); `close()` reshards the last. Every rank must hold
    the same units in the same order (each unshard is an all-gather)."""

    def __init__(self, model: nn.Module, units: list[nn.Module]):
        names = {id(m): n for n, m in model.named_modules()}
        prefixes = sorted(((names[id(u)], u) for u in units), key=lambda x: -len(x[0]))
        self.owner = {}
        for name, mod in model.named_modules():
            self.owner[id(mod)] = next(u for p, u in prefixes if not p or name == p or name.startswith(p + "."))
        self.held: nn.Module | None = None

    def hold(self, module: nn.Module) -> None:
        unit = self.owner[id(module)]
        if unit is not self.held:
            self.close()
            unit.unshard()
            self.held = unit

    def close(self) -> None:
        if self.held is not None:
            self.held.reshard()
            self.held = None


def full(t: torch.Tensor) -> torch.Tensor:
    """A checkpoint's copy of `t` on the CPU: a DTensor gathered (every rank must call it, in
    the same order), a plain tensor cloned."""
    return t.full_tensor().cpu() if is_sharded(t) else t.detach().cpu().clone()


def placed_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A full checkpoint tensor placed as `like` is: this rank's shard of it for a DTensor."""
    if not is_sharded(like):
        return value
    # lazy: torch.distributed.tensor, only under torchrun
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh, like.placements,
                             src_data_rank=None)  # every rank read the same file: no scatter


def optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """opt.state_dict() with every sharded state tensor gathered whole (the one-process file)."""
    sd = opt.state_dict()
    return {**sd, "state": {i: {k: full(v) if is_sharded(v) else v for k, v in st.items()}
                            for i, st in sd["state"].items()}}


def load_optimizer_state(opt: torch.optim.Optimizer, sd: dict) -> None:
    """Load a checkpoint's whole optimizer state, each tensor placed as its parameter is."""
    params = [p for g in opt.param_groups for p in g["params"]]
    state = {i: {k: placed_like(v, params[i]) if torch.is_tensor(v) and v.dim() else v for k, v in st.items()}
             for i, st in sd["state"].items()}
    opt.load_state_dict({**sd, "state": state})


ROWS = 1024  # rows per float64 chunk in squares_by_row (bounds its temporary)


def squares_by_row(g: torch.Tensor) -> torch.Tensor:
    """[rows] float64: the sum of squares of each row (dim-0 slice) of `g`, the whole tensor's
    (a DTensor sharded along dim 0: each rank's rows, gathered). Each row is summed where it lies,
    the same computation on one process or on N: squares of float32 are exact in float64."""
    local = g.to_local() if is_sharded(g) else g
    flat = local.detach().reshape(local.shape[0] if local.dim() else 1, -1)
    rows = torch.cat([c.double().square().sum(1) for c in flat.split(ROWS)]) if len(flat) else \
        flat.new_zeros(0, dtype=torch.float64)
    if not is_sharded(g):
        return rows
    # lazy: torch.distributed.tensor, only under torchrun
    from torch.distributed.tensor import DTensor, Shard

    if tuple(g.placements) != (Shard(0),):
        raise ValueError(f"gradient placed as {g.placements}, expected Shard(0) (fully_shard's default)")
    return DTensor.from_local(rows, g.device_mesh, [Shard(0)], run_check=False, shape=(g.shape[0],),
                              stride=(1,)).full_tensor()


def _units(model: nn.Module) -> tuple[list[nn.Module], str]:
    name, layers = find_layers(model)
    return list(layers), name


def _own_params(model: nn.Module, unit: nn.Module | None) -> list[nn.Parameter]:
    """A unit's own parameters (the root's: those in no decoder layer)."""
    if unit is not None:
        return list(unit.parameters())
    inside = {id(p) for layer in _units(model)[0] for p in layer.parameters()}
    return [p for p in model.parameters() if id(p) not in inside]
