"""Reductions that give every world size the bits one process gives.

- `max_values` / `max_tensors`: max is exact and order-free, so amax (observers, KV cache)
  is reduced with one all-reduce MAX.
- `OrderedReplay`: statistics whose floating-point result depends on the order of updates
  (Hessians H += X^T X, histogram and MSE observers) are not all-reduced. Each such stream
  has an owner rank. An update is split in two: `prepare(x)` (the expensive, per-batch part,
  e.g. the Hessian's X_b^T X_b) runs on the rank that ran batch b; `update` (the fold,
  H = H + X_b^T X_b) runs on the owner. At the end of every round of `size` batches (one per
  rank, batch b on rank b mod size) every rank sends its prepared values to the owners, which
  fold them in rank order, i.e. batch order. One process folds the same values in the same
  order, so the result is bit-identical (the per-batch part is the same computation on the
  same values: thread-count invariant, measured). Cost: one K x K fp32 partial per Hessian
  per batch crosses the network (on NCCL for device tensors); the FLOPs stay data-parallel.
  A routed expert's Hessian is the exception: its batch's rows (T_e x K, T_e << K) cross
  instead, and the owner computes X_b^T X_b (calibration/recorders.py).
- `send_bytes` / `recv_bytes`: any tensor travels as its raw bytes (uint8 view), so FP8 and
  packed FP4 outputs need no dtype support from the backend.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch


def _dist():
    import torch.distributed as dist  # lazy: torch.distributed only under torchrun

    return dist


def max_values(world, values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Elementwise max over ranks of `values` (same keys on every rank; None = not seen)."""
    if not world.distributed:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float("-inf") if values[k] is None else values[k] for k in keys], dtype=torch.float64)
    _dist().all_reduce(t, op=_dist().ReduceOp.MAX)
    return {k: None if v == float("-inf") else v for k, v in zip(keys, t.tolist())}


def max_tensors(world, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Elementwise max over ranks of float tensors; a key some rank lacks counts as -inf there."""
    if not world.distributed:
        return dict(tensors)
    shapes = {}
    for part in world.all_objects("max_tensors/shapes", {k: tuple(v.shape) for k, v in tensors.items()}):
        shapes.update(part)
    keys = sorted(shapes)
    flat = [tensors[k].float().cpu().reshape(-1) if k in tensors
            else torch.full((int(torch.tensor(shapes[k]).prod()),), float("-inf")) for k in keys]
    if not flat:
        return {}
    t = torch.cat(flat)
    _dist().all_reduce(t, op=_dist().ReduceOp.MAX)
    out, i = {}, 0
    for k, f in zip(keys, flat):
        out[k] = t[i: i + f.numel()].reshape(shapes[k])
        i += f.numel()
    return out


def broadcast(world, tensor: torch.Tensor | None) -> torch.Tensor:
    """Rank 0's CPU tensor on every rank."""
    if not world.distributed:
        return tensor
    if world.is_root:
        world.share("broadcast/meta", (tuple(tensor.shape), str(tensor.dtype)))
    shape, dtype = world.fetch("broadcast/meta")
    buf = tensor.contiguous() if world.is_root else torch.empty(shape, dtype=_dtype(dtype))
    raw = as_bytes(buf)
    _dist().broadcast(raw, src=0)
    return buf


def broadcast_into(world, tensors: list[torch.Tensor], src: int) -> None:
    """Rank `src`'s values of `tensors` (contiguous CPU tensors every rank holds with the same shapes
    and dtypes) copied into every rank's, in place, in list order."""
    if not world.distributed:
        return
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError("broadcast_into needs contiguous tensors (it writes through their storage)")
        _dist().broadcast(as_bytes(t), src=src)


def share_tensors(world, mine: Mapping[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """Every rank's CPU tensors on every rank (names unique across ranks): each broadcast from
    the rank that has it, in rank and name order."""
    if not world.distributed:
        return dict(mine)
    metas = world.all_objects(name, {k: (tuple(t.shape), str(t.dtype)) for k, t in mine.items()})
    out = {}
    for r, meta in enumerate(metas):
        for k in sorted(meta):
            shape, dtype = meta[k]
            buf = mine[k].contiguous() if r == world.rank else torch.empty(shape, dtype=_dtype(dtype))
            _dist().broadcast(as_bytes(buf), src=r)
            out[k] = buf
    return out


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 tensor (a view, no copy)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def send_bytes(t: torch.Tensor, dst: int, tag: int = 0):
    """Start sending `t` to rank `dst`; keep the returned (work, buffer) alive until `work.wait()`."""
    raw = as_bytes(t)
    return _dist().isend(raw, dst=dst, tag=tag), raw


def recv_bytes(shape, dtype: torch.dtype, src: int, device="cpu", tag: int = 0) -> torch.Tensor:
    """Receive a tensor of `shape`/`dtype` that `send_bytes` sent from rank `src`."""
    n = int(torch.Size(shape).numel()) * dtype.itemsize
    raw = torch.empty(n, dtype=torch.uint8, device=device)
    _dist().recv(raw, src=src, tag=tag)
    return raw.view(dtype).reshape(shape)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


class OrderedReplay:
    """Streams of inputs replayed on their owner rank in global batch order (module docstring).

    `wrap(key, update, prepare)` returns what the hook should call with each input x:
    `update(*prepare(x))` in one process; otherwise a function that keeps prepare(x) (a tuple
    of tensors) until `flush()` (every rank calls it after each round, even a rank that had no
    batch in that round)."""

    def __init__(self, world, owners: Mapping[str, int]):
        self.world, self.owners = world, dict(owners)
        self._fns: dict[str, Callable[[torch.Tensor], None]] = {}
        self._kept: dict[str, list[torch.Tensor]] = {}
        self._round = 0

    def wrap(self, key: str, update: Callable[..., None],
             prepare: Callable[[torch.Tensor], tuple] = lambda x: (x,)) -> Callable[[torch.Tensor], None]:
        if not self.world.distributed:
            return lambda x: update(*prepare(x))
        if key not in self.owners:
            raise KeyError(f"replayed stream {key!r} has no owner")
        self._fns[key] = update
        return lambda x: self._kept.setdefault(key, []).append(tuple(t.detach() for t in prepare(x.detach())))

    def flush(self) -> None:
        """Deliver this round's inputs to their owners, which apply them in rank (= batch) order."""
        world = self.world
        if not world.distributed or not self._fns:
            return
        meta = {k: [[(tuple(t.shape), str(t.dtype), t.device.type) for t in item] for item in v]
                for k, v in self._kept.items()}
        metas = world.all_objects(f"replay/{self._round}", meta)
        pending = []
        for key in sorted(self._fns):
            owner, kept = self.owners[key], self._kept.get(key, [])
            if world.rank != owner:
                pending += [send_bytes(t, owner) for item in kept for t in item]
                continue
            for r in range(world.size):
                for i, item in enumerate(metas[r].get(key, [])):
                    values = kept[i] if r == world.rank else tuple(
                        recv_bytes(shape, _dtype(dtype), r, device=_device(dev)) for shape, dtype, dev in item)
                    self._fns[key](*values)
        for work, _ in pending:
            work.wait()
        self._kept.clear()
        self._round += 1


def _device(dev_type: str):
    """Receive onto this rank's device of the sender's kind (cuda -> this rank's current GPU)."""
    if dev_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return "cpu"
