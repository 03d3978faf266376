"""This process's place in a run: rank, world size, node, the process group and its store.

One tfcompile process is `LOCAL` (rank 0 of 1; no process group, every collective a no-op).
Under torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
`MASTER_ADDR`/`MASTER_PORT` in the environment, from any rendezvous: one node, `--nnodes K`,
Slurm) `current()` joins the default process group once per process:

- backend `cpu:gloo,cuda:nccl` when CUDA is present (torch dispatches each collective by the
  tensors' device: NCCL for activations on the GPU, gloo for CPU tensors), plain `gloo` on a
  CPU build. Nothing else carries data between ranks (no sockets or files of our own);
- the c10d store that the rendezvous created (torchrun's agent hosts it, so it outlives any
  worker) holds small control records: the staging directory, root-only pass results,
  barriers and failure reports (tfcompile/dist/failure.py).

Keys are namespaced per run (`World.begin_run`), so several CLI invocations may share one
process group (the tests run a matrix of quantizations under one torchrun).
"""

from __future__ import annotations

import copy

import os
import pickle
import time
from datetime import timedelta
from typing import Any

from tfcompile.dist.failure import PeerFailed, peer_failure
from tfcompile.errors import UserError
from tfcompile.settings import DEFAULT_DIST_TIMEOUT_S, settings

POLL_S = 0.02  # store polling interval while waiting for peers


class World:
    """Rank `rank` of `size` processes (`nodes` nodes); `store`/`group` are None when size is 1."""

    def __init__(self, rank: int = 0, size: int = 1, *, local_rank: int = 0, local_size: int = 1,
                 node: int = 0, nodes: int = 1, store: Any = None, timeout_s: float = DEFAULT_DIST_TIMEOUT_S):
        self.rank, self.size = rank, size
        self.local_rank, self.local_size, self.node, self.nodes = local_rank, local_size, node, nodes
        self.store, self.timeout_s = store, timeout_s
        self.run_id = 0  # namespace of this invocation's store keys
        self.scope = ""  # namespace of the objects and barriers of a `scoped` view
        self.current_pass = "setup"
        self.barriers = 0

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, size={self.size}, node={self.node}/{self.nodes})"

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def begin_run(self) -> None:
        """A new invocation: fresh store keys (every rank calls this in the same order)."""
        self.run_id += 1
        self.current_pass, self.barriers = "setup", 0

    def scoped(self, name: str) -> "World":
        """The same ranks, store and failure reports, with the objects and barriers under `name`: for a
        second set of collectives in one run that reuses the first set's tags (the MTP layers'
        calibration runs its own `Recorders`: tfcompile/draft/mtp_calibrate.py)."""
        if not self.distributed:
            return self
        view = copy.copy(self)
        view.scope, view.barriers = f"{self.scope}{name}/", 0
        return view

    def key(self, name: str) -> str:
        return f"tfcompile/{self.run_id}/{name}"

    # ---- small objects through the store (control data: paths, pass results, figures) ----

    def share(self, name: str, obj: Any) -> None:
        """Publish `obj` under `name` (pickled; only ever read by our own ranks)."""
        if self.distributed:
            self.store.set(self.key(f"obj/{self.scope}{name}"), pickle.dumps(obj))

    def fetch(self, name: str, *, waiting_for: str = "rank 0") -> Any:
        """The object another rank shared under `name`; waits while every peer is healthy."""
        key = self.key(f"obj/{self.scope}{name}")
        self.wait_until(lambda: self.store.check([key]), f"'{name}' from {waiting_for}")
        return pickle.loads(self.store.get(key))  # noqa: S301 - written by our own ranks

    def all_objects(self, name: str, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (each rank shares its own)."""
        if not self.distributed:
            return [obj]
        self.share(f"{name}/{self.rank}", obj)
        return [obj if r == self.rank else self.fetch(f"{name}/{r}", waiting_for=f"rank {r}")
                for r in range(self.size)]

    def barrier(self, tag: str) -> None:
        """Every rank reaches `tag`; a failed or vanished peer raises PeerFailed instead of hanging."""
        if not self.distributed:
            return
        self.barriers += 1
        key = self.key(f"barrier/{self.scope}{self.barriers}:{tag}")
        self.store.add(key, 1)
        self.wait_until(lambda: self.store.add(key, 0) >= self.size, f"every rank at '{tag}'")

    def wait_until(self, ready, what: str) -> None:
        """Poll `ready()`; raise PeerFailed when a peer reported a failure, TimeoutError-like
        PeerFailed after `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            failure = peer_failure(self)
            if failure:
                raise PeerFailed(failure)
            if time.monotonic() > deadline:
                raise PeerFailed(f"rank {self.rank} waited {self.timeout_s:.0f} s for {what}",
                                 hint="a peer is hung or much slower; raise TFCOMPILE_DIST_TIMEOUT "
                                      "(seconds) if that is expected")
            time.sleep(POLL_S)


LOCAL = World()
_JOINED: World | None = None


def current() -> World:
    """The world of this process: LOCAL, or (under torchrun with WORLD_SIZE > 1) the joined
    process group, created on the first call and reused by later ones."""
    global _JOINED
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        return LOCAL
    if _JOINED is None:
        _JOINED = _join(size)
    return _JOINED


def _join(size: int) -> World:
    # lazy: torch.distributed only under torchrun
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    env = os.environ
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise UserError(f"WORLD_SIZE={size} but {', '.join(missing)} not set",
                        hint="launch with torchrun --nproc-per-node N -m tfcompile ... (docs/distributed.md)")
    timeout = settings().dist_timeout
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout))

    local_size = int(env.get("LOCAL_WORLD_SIZE", size))
    return World(dist.get_rank(), dist.get_world_size(), local_rank=int(env.get("LOCAL_RANK", 0)),
                 local_size=local_size, node=int(env.get("GROUP_RANK", 0)),
                 nodes=max(1, size // max(1, local_size)), store=_get_default_store(), timeout_s=timeout)
