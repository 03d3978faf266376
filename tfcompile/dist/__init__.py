"""Running tfcompile on many processes, GPUs and nodes (torch.distributed; docs/distributed.md).

- world.py: rank, size, node, the process group (gloo on CPU, NCCL on GPU) and its store
- devices.py: `--device auto|cpu|cuda|cuda:N` resolved per rank
- partition.py: deterministic assignment of batches, shards and solves to ranks
- collect.py: exact reductions (max) and ordered replay (bit-identical statistics)
- stream.py: pack's jobs computed on one rank, delivered to the ranks that write them
- failure.py: one failed or killed rank fails the run, named with its pass
- driver.py: the pipeline over the ranks (one staging directory, root-only passes)

Imports flow one way: this package imports only tfcompile.errors (and torch) at module level,
so calibration and passes may import it.
"""

from tfcompile.dist.world import LOCAL, World, current

__all__ = ["LOCAL", "World", "current"]
