"""Run an ordered list of jobs over the ranks: each job computed on one rank, its outputs
delivered, in job order, to the ranks that write them.

pack uses it with jobs = the program's fusion groups and copies, writers = the owners of the
shards their tensors land in (shard i: rank i mod N), compute = the writer for cheap jobs
(RTN: no transfer at all) or the rank that holds the job's state (GPTQ: the owner of the
group's Hessian). Each rank writes only its own shards; the bytes of every tensor are those
one process computes, because every job runs the same code on the same inputs.

Order and memory: jobs go in windows of about WINDOW_BYTES of output. Within a window a rank
first computes its own jobs in order, starting the sends at once, and delivers each to its own
sink as soon as every earlier job it writes has been delivered (so with no transfers, memory
stays at one job); then it delivers the rest in order, receiving what others computed. Sends
never block and receives only wait for earlier-or-equal jobs of other ranks, so there is no
cycle (no deadlock), and at most one window of outputs is held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tfcompile.dist.collect import recv_bytes, send_bytes

WINDOW_BYTES = 512 << 20


@dataclass(frozen=True)
class Plan:
    compute: tuple[int, ...]  # job -> the rank that computes it
    writers: tuple[frozenset, ...]  # job -> the ranks that write any of its outputs
    specs: tuple[tuple, ...]  # job -> ((name, dtype, shape), ...) of the tensors compute returns

    def windows(self, limit: int = WINDOW_BYTES) -> list[range]:
        out, lo, size = [], 0, 0
        for i, specs in enumerate(self.specs):
            size += sum(_nbytes(d, s) for _, d, s in specs)
            if size >= limit:
                out.append(range(lo, i + 1))
                lo, size = i + 1, 0
        if lo < len(self.specs):
            out.append(range(lo, len(self.specs)))
        return out


def run_jobs(world, plan: Plan, compute: Callable[[int], tuple[dict, object]],
             deliver: Callable[[int, dict], None], window_bytes: int = WINDOW_BYTES) -> dict[int, object]:
    """Compute this rank's jobs, deliver every job this rank writes in order; returns
    {job: extra} for the jobs computed here (`compute(i) -> (tensors by name, extra)`)."""
    rank, extras = world.rank, {}
    digest = hash((plan.compute, plan.writers))
    if len(set(world.all_objects("stream/plan", digest))) != 1:  # a bug, but never a hang
        raise RuntimeError("ranks computed different job assignments; refusing to exchange tensors")
    for window in plan.windows(window_bytes):
        held: dict[int, dict] = {}
        sends = []
        todo = [i for i in window if rank in plan.writers[i]]  # deliveries, in order
        for i in window:
            if plan.compute[i] != rank:
                continue
            tensors, extras[i] = compute(i)
            for w in sorted(plan.writers[i] - {rank}):
                sends += [send_bytes(tensors[name], w) for name, _, _ in plan.specs[i]]
            if rank in plan.writers[i]:
                held[i] = tensors
            while todo and todo[0] in held:  # in-order deliveries that need nothing from others
                j = todo.pop(0)
                deliver(j, held.pop(j))
        for j in todo:
            tensors = held.pop(j, None)
            if tensors is None:
                tensors = {name: recv_bytes(shape, dtype, plan.compute[j]) for name, dtype, shape in plan.specs[j]}
            deliver(j, tensors)
        for work, _ in sends:
            work.wait()
    return extras


def _nbytes(dtype, shape: Sequence[int]) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= int(d)
    return n
