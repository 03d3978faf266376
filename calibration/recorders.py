"""Forward hooks that collect calibration statistics, whatever loop runs the model.

The whole-model loop (calibration.forward) and the layer-by-layer loop
(calibration.sequential) install the same `Recorders` on modules found by
name, so both produce the same `CalibStats` for the same tokens.

Under torchrun (`world` of several ranks, each running its own batches): `max` observers and
the KV observer update locally and are reduced by an all-reduce MAX at the end (exact); the
Hessians and the other observers, whose floating-point result depends on the order of
updates, are replayed on an owner rank in batch order (tfcompile/dist/collect.py), after each
round of batches (`flush`). Either way the statistics are bit-identical to one process's.
"""

from __future__ import annotations

import re
import time

import torch
from torch import nn

from tfcompile.calibration.awq_stats import AWQRecorder
from tfcompile.calibration.observers import Observer, make_observer
from tfcompile.calibration.stats import CalibStats
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import OrderedReplay, max_tensors, max_values
from tfcompile.errors import CheckpointError


class Recorders:
    """Every hook of one calibration run; `remove()` them, then `stats()`."""

    def __init__(self, model: nn.Module, modules: set[str], *, observer: str = "max",
                 observer_params: dict | None = None,
                 hessian_groups: dict[str, str] | None = None, kv: bool = False,
                 awq_groups: dict[str, str] | None = None, world=LOCAL,
                 hessian_owner: dict[str, int] | None = None):
        self.modules, self.world = set(modules), world
        self.observers: dict[str, Observer] = {}
        self.hooks = []
        names = [n for n, _ in model.named_modules() if n in self.modules or _expert_parent(n, self.modules)]
        # order-sensitive observers are replayed on an owner (round robin); max reduces exactly
        self.replayed = set() if observer == "max" else set(names)
        owners = {f"obs/{n}": i % world.size for i, n in enumerate(sorted(self.replayed))}
        owners.update({f"hess/{k}": r for k, r in (hessian_owner or {}).items()})
        self.replay = OrderedReplay(world, owners)
        for name, mod in model.named_modules():
            if name in names:
                self.observers[name] = obs = make_observer(observer, **(observer_params or {}))
                update = self.replay.wrap(f"obs/{name}", obs.update) if name in self.replayed else obs.update
                self.hooks.append(mod.register_forward_pre_hook(_observe(update)))
        self.hessians = HessianRecorder(model, hessian_groups or {}, self.replay)
        self.hooks += self.hessians.hooks
        self.awq = AWQRecorder(model, awq_groups or {})  # member -> group key; {} installs nothing
        self.hooks += self.awq.hooks
        self.kv = None
        if kv:
            from tfcompile.calibration.kv import KVObserver, install

            self.kv = KVObserver(model)
            model.set_attn_implementation(install(self.kv))

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def flush(self) -> None:
        """End of a round of batches (one per rank): replay the order-sensitive updates."""
        self.replay.flush()

    def stats(self, tokens: int, source: str, model_dir=None) -> CalibStats:
        """The statistics; with `kv`, raises if no attention call reached the KV observer.
        Under torchrun every rank gets the same amax; `hessians` holds the groups this rank
        owns (CalibStats.hessian_owner says which rank holds each)."""
        world = self.world
        kv_k = max_tensors(world, self.kv.k) if self.kv is not None else {}
        if self.kv is not None and not kv_k:
            raise CheckpointError(f"{model_dir}: no attention call went through transformers' "
                                  "AttentionInterface, so KV-cache scales cannot be calibrated",
                                  hint="this architecture is not supported for --kv-cache yet")
        kv_v = max_tensors(world, self.kv.v) if self.kv is not None else {}
        amax = max_values(world, {n: o.amax() for n, o in self.observers.items() if n not in self.replayed})
        hessians, seconds, owner = self.hessians.result(), {}, {}
        mine = {n: self.observers[n].amax() for n in self.replayed}
        held = sorted(set(hessians) | self.hessians.taken)
        for r, (part, keys, secs) in enumerate(world.all_objects("calib/stats", (mine, held, self.hessians.seconds))):
            amax.update({n: v for n, v in part.items() if self.replay.owners[f"obs/{n}"] == r})
            owner.update(dict.fromkeys(keys, r))
            for k, v in secs.items():  # every rank computed X^T X for its own batches
                seconds[k] = seconds.get(k, 0.0) + v
        amax = {n: v for n, v in sorted(amax.items()) if v is not None}
        resolved, fallback = _resolve(self.modules, amax)
        kv_amax = {n: (kv_k[n], kv_v[n]) for n in sorted(kv_k)}
        awq, awq_skipped = self.awq.result()  # after kv_amax: its fold check runs the model
        return CalibStats(resolved, tokens, source, tuple(fallback), kv_amax, hessians=hessians,
                          hessian_seconds=dict(sorted(seconds.items())),
                          awq=awq, awq_skipped=awq_skipped,
                          hessian_owner=owner if world.distributed else {})


class HessianRecorder:
    """H = X^T X / n of each fusion group's input, recorded on one member (they share X).

    Memory: one float32 [K, K] per group observed so far."""

    def __init__(self, model: nn.Module, groups: dict[str, str], replay=None):
        self._h: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        self.taken: set[str] = set()  # keys handed out by take() (spilled by the layer loop)
        self.seconds: dict[str, float] = {}  # group key -> seconds spent computing X^T X
        route = replay.wrap if replay is not None else (lambda key, fold, prep: lambda x: fold(*prep(x)))
        self.hooks = [mod.register_forward_pre_hook(_first_arg(route(f"hess/{groups[name]}", self._fold(groups[name]),
                                                                     self._prepare(groups[name]))))
                      for name, mod in model.named_modules() if name in groups]

    def _prepare(self, key: str):
        """One batch's X^T X (fp32, on x's device) and its row count: the expensive part, which
        under torchrun runs on the rank that ran the batch."""
        def prepare(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            t0 = time.perf_counter()
            x = x.detach().reshape(-1, x.shape[-1]).float()
            h = x.T @ x
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
            return h, torch.tensor([x.shape[0]])

        return prepare

    def _fold(self, key: str):
        """H = H + X_b^T X_b in batch order (on the group's owner rank under torchrun)."""
        def fold(h: torch.Tensor, rows: torch.Tensor) -> None:
            self._h[key] = h if key not in self._h else self._h[key] + h
            self._n[key] = self._n.get(key, 0) + int(rows)

        return fold

    def result(self) -> dict[str, torch.Tensor]:
        return {k: self._h[k] / self._n[k] for k in sorted(self._h)}

    def take(self) -> dict[str, torch.Tensor]:
        """The finished Hessians so far, forgotten here (the layer loop spills them)."""
        out = self.result()
        self.taken.update(out)
        self._h.clear()
        self._n.clear()
        return out


def _observe(update):
    def hook(mod: nn.Module, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.numel():
            update(x)

    return hook


def _first_arg(update):
    return lambda mod, args: update(args[0])


def _expert_parent(name: str, modules: set[str]) -> bool:
    """A fused experts module (transformers v5) whose per-expert Linears we quantize."""
    return name.endswith("experts") and any(m.startswith(name + ".") for m in modules)


def _resolve(modules: set[str], amax: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Give every module a positive amax; modules no token reached get a fallback.

    Fallback (documented in docs/design.md): a fused expert's gate/up input is
    the experts module's input; anything else takes the largest amax observed
    in the same decoder layer, else the model-wide largest. Never zero.
    """
    out, fallback = {}, []
    top = max(amax.values(), default=1.0) or 1.0
    for m in sorted(modules):
        v = amax.get(m)
        if v is None and re.search(r"\.experts\.\d+\.(gate_proj|up_proj)$", m):
            v = amax.get(m.rsplit(".", 2)[0])
        if not v:
            layer = re.match(r"(.*?\.\d+)\.", m)
            same = [a for k, a in amax.items() if layer and k.startswith(layer.group(1) + ".")]
            v = max(same, default=0.0) or top
            fallback.append(m)
        out[m] = v
    return out, fallback
