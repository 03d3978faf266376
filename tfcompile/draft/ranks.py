"""`tfcompile draft` over torchrun ranks: who computes which data chunk and which part of a step.

Under torchrun (`tfcompile.dist.current()`, gloo on the CPU, NCCL for CUDA gradients) every rank
holds the whole target and the whole draft (the draft is one decoder layer). The work is split:

- data: self-generation (train.greedy_continue, chunks of GEN_BATCH rows) and the TargetCache
  (fixed chunks of 8 rows): chunk c is computed by rank c mod N, exactly as one process computes
  it (same rows, same kernels), then broadcast from that rank, so every rank holds one process's
  tokens and cache bit for bit (a broadcast copies; the thread count must match: torchrun runs
  each rank on one thread, so compare with OMP_NUM_THREADS=1);
- training: each step's `batch` sequences are cut into `batch_parts` P equal parts (default: the
  number of processes N; P a multiple of N); rank r computes parts r*P/N .. (r+1)*P/N - 1, one
  forward and backward each (gradients accumulate), the gradients are summed over the ranks
  (all_reduce) and divided by P. One process with the same P runs the same parts in turn. The
  loss of a part is ttt_loss's mean over its rows, all parts have the same rows, so the step's
  gradient is the mean over the batch whatever P is; its bits depend on P (a GEMM over B rows
  sums in another order than two over B/2), which is why P is in the recorded config.
  For P = N = 2 the result is one process's with `--batch-parts 2` bit for bit: one process
  accumulates g0 + g1, the all-reduce of two ranks adds the same two tensors (a + b = b + a
  exactly), and the division by 2 is exact. For N > 2 the all-reduce sums in another order
  (a ring), and with P = k N (k > 1) each rank adds its k parts before the all-reduce: deterministic
  for a fixed N, equal to one process within float32 rounding per step; the record then names N
  (training.processes).
"""

from __future__ import annotations

import dataclasses

import torch

from tfcompile.dist.world import World
from tfcompile.distill.ddp import mean_over_ranks
from tfcompile.errors import UserError


def resolve_parts(cfg, world: World):
    """cfg with batch_parts resolved (0: the number of processes), checked against the world size
    before any work: UserError with a hint when --batch (or --batch-parts) does not split."""
    n = world.size
    parts = cfg.batch_parts or n
    if parts % n:
        raise UserError(f"draft: --batch-parts {parts} is not a multiple of the {n} processes",
                        hint=f"give --batch-parts {n} (or a multiple of {n}), or leave it out")
    if cfg.batch % parts:
        over = f"the {n} processes" if not cfg.batch_parts else f"--batch-parts {parts}"
        raise UserError(f"draft: --batch {cfg.batch} does not split over {over} (each step's sequences are "
                        f"cut into {parts} equal parts, {parts // n} per process)",
                        hint=f"make --batch a multiple of {parts}, e.g. --batch {parts * max(1, cfg.batch // parts)}")
    return dataclasses.replace(cfg, batch_parts=parts)


def same_as_one_process(cfg, world: World) -> bool:
    """Whether this run's bits are one process's with the same --batch-parts: one process, or two
    computing one part each (the all-reduce adds the two gradients as one process accumulates
    them). Otherwise the record names the number of processes."""
    return world.size == 1 or world.size == cfg.batch_parts == 2


def owner(chunk: int, world: World) -> int:
    """The rank that computes data chunk `chunk` (round robin)."""
    return chunk % world.size


def broadcast_chunks(bufs: list[torch.Tensor], world: World) -> None:
    """Fill every rank's chunk buffers with their owners' values, in place (chunk c from rank
    c mod N; bufs[c] contiguous, on the CPU: gloo). One process: nothing to do."""
    if not world.distributed:
        return
    import torch.distributed as dist  # lazy: only under torchrun

    for c, buf in enumerate(bufs):
        dist.broadcast(buf, src=owner(c, world))


def my_parts(cfg, world: World) -> range:
    """The parts of every step's batch this rank computes: P/N consecutive ones."""
    k = cfg.batch_parts // world.size
    return range(world.rank * k, (world.rank + 1) * k)


def part_rows(idx, part: int, cfg):
    """Rows of the step's ordered sequences `idx` [batch] that part `part` trains: [batch / P]."""
    b = cfg.batch // cfg.batch_parts
    return idx[part * b:(part + 1) * b]


@torch.no_grad()
def average_grads(params: list, cfg, world: World) -> None:
    """The trainable parameters' gradients (each the sum of this rank's parts) summed over the
    ranks, then divided by P: the mean over the step's parts (a no-op for one process and P = 1)."""
    if world.distributed:
        import torch.distributed as dist  # lazy: only under torchrun

        for _, p in params:
            if p.grad is not None:  # None on every rank alike (the same graph)
                dist.all_reduce(p.grad)
    if cfg.batch_parts > 1:
        for _, p in params:
            if p.grad is not None:
                p.grad.div_(cfg.batch_parts)


def mean_parts(sums: dict[str, float], cfg, world: World) -> dict[str, float]:
    """The step's logged figures from this rank's sums over its parts: each rank's mean over its
    parts, averaged over the ranks (ddp.mean_over_ranks, float64): for P = N the ranks' values
    added and divided by N, one process's (a + b) / 2 to the bit for N = 2."""
    k = cfg.batch_parts // world.size
    return mean_over_ranks({name: v / k for name, v in sums.items()}, world)
