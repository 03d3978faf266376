"""`plan --estimate` for a recipe with the distill pass: memory per rank under DDP and FSDP2, and
which one `distill.sharding` (auto) picks. The counts come from the meta model and the plan
(the Linears the student fake-quantizes); the arithmetic is the run's own
(tfcompile/distill/memory.py). Training time is not estimated (no measured training throughput)."""

from __future__ import annotations

import math
import re

from tfcompile.distill.memory import Counts, fits, host_bytes, optimizer_states, per_rank_bytes

GB = 1e9
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def distill_estimate(shape, plan, cfg, ranks: int, capacity_gb: float, on_device: bool) -> dict:
    """The distill pass's entry of the estimate: device (or host) GB per rank for DDP and FSDP2."""
    c = counts(shape, plan, cfg)
    ddp, fsdp = (per_rank_bytes(c, s, ranks)["total"] for s in ("ddp", "fsdp"))
    if ranks == 1:
        sharding = None  # one process: the whole student, nothing to shard
    elif cfg.sharding != "auto":
        sharding = cfg.sharding
    else:
        sharding = "ddp" if fits(ddp, int(capacity_gb * GB)) else "fsdp"
    held = fsdp if sharding == "fsdp" else ddp
    whole_teacher = cfg.teacher != "online" or cfg.data == "self"  # FSDP2 builds the others sharded
    host = host_bytes(c, sharding or "ddp", ranks, shape.params, whole_teacher, on_device) / GB
    out = {"seconds": 0.0, "host_gb": round(host, 3), "sharding": sharding,
           "ddp_gb_per_rank": round(ddp / GB, 3), "fsdp_gb_per_rank": round(fsdp / GB, 3),
           "note": "model state only (float32 weights, gradients, optimizer state, teacher); activations "
                   "not counted; training time not estimated"}
    if on_device:
        out["device_gb"] = round(held / GB, 3)
    return out


def counts(shape, plan, cfg) -> Counts:
    """Element counts of the run (memory.Counts) from the meta model's shapes and the plan."""
    extra = {}  # trained elements per unit (layer index, or None for the root)
    for t in plan.targets():
        n, k = t.shape[-2], t.shape[-1]
        e = math.prod(t.shape[:-2])  # experts, if any
        size = {"weights": n * k, "scales": n * k // plan.scheme.block[0], "lora": cfg.lora_rank * (n + k)}[cfg.train]
        unit = _unit(t.module)
        extra[unit] = extra.get(unit, 0) + e * size
    if cfg.train_unquantized:
        tensors = {t.name: t for t in shape.tensors}
        for name in plan.passthrough:
            if name in tensors:
                extra[_unit(name)] = extra.get(_unit(name), 0) + math.prod(tensors[name].shape)
    added = 0 if cfg.train == "weights" else sum(extra.values())  # alphas or LoRA factors
    sizes = {layer.index: layer.params for layer in shape.layers}
    sizes[None] = shape.params - sum(sizes.values())
    grown = {u: s + (0 if cfg.train == "weights" else extra.get(u, 0)) for u, s in sizes.items()}
    big = max((u for u in grown if u is not None), key=grown.get)
    trained = sum(extra.values())
    freed = cfg.teacher == "cache" and not cfg.heldout_tokens
    return Counts(trained=trained, frozen=shape.params + added - trained, teacher=0 if freed else shape.params,
                  layer=grown[big], layer_trained=extra.get(big, 0), root=grown[None],
                  root_trained=extra.get(None, 0), states=optimizer_states(cfg.optimizer, cfg.momentum),
                  shard_teacher=cfg.teacher == "online")


def _unit(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None
