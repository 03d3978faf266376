"""Distillation over torchrun ranks: the data split, DistributedDataParallel (docs/distributed.md).

Under DDP every rank holds the whole student and teacher; under FSDP2 (fsdp.py) each holds a
shard of the student, and the data is split the same way. Each optimizer step's
`batch x grad_accum` blocks are split over the ranks -- whole micro-batches when grad_accum is
a multiple of the world size, else every micro-batch's blocks -- and DDP (or FSDP2's
reduce-scatter) averages the gradients, so a step sees the same blocks and the same expected
gradient as one process. For N = 2 the average, (a + b) / 2, is one process's a/2 + b/2
exactly; for other N the sum runs in another order, so N processes are deterministic for a
fixed N but not bit-identical to one process (processes are in the resume fingerprint).
Parameters stay identical on every rank (same averaged gradients, same steps).
"""

from __future__ import annotations

import signal

import torch

from tfcompile.errors import RecipeError


def check_data_parallel(cfg, world) -> None:
    if cfg.mode != "model":
        raise RecipeError("distill.mode layerwise does not run on more than one process yet",
                          hint="use --mode model under torchrun, or run layerwise without torchrun")
    if cfg.grad_accum % world.size and cfg.batch % world.size:
        raise RecipeError(f"distill: {world.size} processes split neither --grad-accum {cfg.grad_accum} nor "
                          f"--batch {cfg.batch}", hint=f"make --batch or --grad-accum a multiple of {world.size}")


def micro_share(cfg, world) -> list[tuple[int, slice]]:
    """(micro-batch index, slice of its blocks) this rank runs in every step."""
    if not world.distributed:
        return [(m, slice(None)) for m in range(cfg.grad_accum)]
    if cfg.grad_accum % world.size == 0:
        return [(m, slice(None)) for m in range(world.rank, cfg.grad_accum, world.size)]
    return [(m, slice(world.rank, None, world.size)) for m in range(cfg.grad_accum)]


def data_parallel(model: torch.nn.Module, world, device: torch.device, sharding: str = "ddp"):
    """The model DDP-wrapped under torchrun (gloo on CPU, NCCL on the GPU), else as is (one
    process, or FSDP2: fully_shard installed its own gradient reduce-scatter)."""
    if not world.distributed or sharding == "fsdp":
        return model
    from torch.nn.parallel import DistributedDataParallel  # lazy: only under torchrun

    ids = [device.index] if device.type == "cuda" else None
    # buffers (RoPE tables) are computed alike on every rank: no per-forward broadcast
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


def mean_over_ranks(sums: dict[str, float], world) -> dict[str, float]:
    """The step's losses averaged over ranks (what one process would log for the whole step)."""
    if not world.distributed:
        return sums
    import torch.distributed as dist  # lazy: only under torchrun

    keys = sorted(sums)
    t = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: v / world.size for k, v in zip(keys, t.tolist())}


def agree_stop(stop, world):
    """The stop flag (a signal number, or False) every rank acts on: set when any rank's is, so all
    ranks stop at the same step boundary (FSDP2's checkpoint gathers need every rank)."""
    import torch.distributed as dist  # lazy: only under torchrun

    t = torch.tensor([int(stop or 0)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return stop or (signal.Signals(int(t)) if int(t) else False)
