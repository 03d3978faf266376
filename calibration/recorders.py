"""Forward hooks that collect calibration statistics, whatever loop runs the model.

The whole-model loop (calibration.forward) and the layer-by-layer loop
(calibration.sequential) install the same `Recorders` on modules found by
name, so both produce the same `CalibStats` for the same tokens.
"""

from __future__ import annotations

import re
import time

import torch
from torch import nn

from tfcompile.calibration.awq_stats import AWQRecorder
from tfcompile.calibration.kv import KVObserver, install
from tfcompile.calibration.observers import Observer, make_observer
from tfcompile.errors import CheckpointError
from tfcompile.ir import CalibStats


class Recorders:
    """Every hook of one calibration run; `remove()` them, then `stats()`."""

    def __init__(self, model: nn.Module, modules: set[str], *, observer: str = "max",
                 observer_params: dict | None = None,
                 hessian_groups: dict[str, str] | None = None, kv: bool = False,
                 awq_groups: dict[str, str] | None = None):
        self.modules = set(modules)
        self.observers: dict[str, Observer] = {}
        self.hooks = []
        for name, mod in model.named_modules():
            if name in self.modules or _expert_parent(name, self.modules):
                self.observers[name] = make_observer(observer, **(observer_params or {}))
                self.hooks.append(mod.register_forward_pre_hook(_observe(self.observers[name])))
        self.hessians = HessianRecorder(model, hessian_groups or {})
        self.hooks += self.hessians.hooks
        self.awq = AWQRecorder(model, awq_groups or {})  # member -> group key; {} installs nothing
        self.hooks += self.awq.hooks
        self.kv = None
        if kv:
            self.kv = KVObserver(model)
            model.set_attn_implementation(install(self.kv))

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def stats(self, tokens: int, source: str, model_dir=None) -> CalibStats:
        """The statistics; with `kv`, raises if no attention call reached the KV observer."""
        if self.kv is not None and not self.kv.k:
            raise CheckpointError(f"{model_dir}: no attention call went through transformers' "
                                  "AttentionInterface, so KV-cache scales cannot be calibrated",
                                  hint="this architecture is not supported for --kv-cache yet")
        amax = {n: v for n, o in self.observers.items() if (v := o.amax()) is not None}
        resolved, fallback = _resolve(self.modules, amax)
        kv_amax = {} if self.kv is None else {n: (self.kv.k[n], self.kv.v[n]) for n in sorted(self.kv.k)}
        awq, awq_skipped = self.awq.result()  # after kv_amax: its fold check runs the model
        return CalibStats(resolved, tokens, source, tuple(fallback), kv_amax, hessians=self.hessians.result(),
                          hessian_seconds=dict(sorted(self.hessians.seconds.items())),
                          awq=awq, awq_skipped=awq_skipped)


class HessianRecorder:
    """H = X^T X / n of each fusion group's input, recorded on one member (they share X).

    Memory: one float32 [K, K] per group observed so far."""

    def __init__(self, model: nn.Module, groups: dict[str, str]):
        self._h: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # group key -> seconds spent accumulating its H
        self.hooks = [mod.register_forward_pre_hook(self._hook(groups[name]))
                      for name, mod in model.named_modules() if name in groups]

    def _hook(self, key: str):
        def hook(mod: nn.Module, args):
            t0 = time.perf_counter()
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            h = x.T @ x
            self._h[key] = h if key not in self._h else self._h[key] + h
            self._n[key] = self._n.get(key, 0) + x.shape[0]
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0

        return hook

    def result(self) -> dict[str, torch.Tensor]:
        return {k: self._h[k] / self._n[k] for k in sorted(self._h)}

    def take(self) -> dict[str, torch.Tensor]:
        """The finished Hessians so far, forgotten here (the layer loop spills them)."""
        out = self.result()
        self._h.clear()
        self._n.clear()
        return out


def _observe(obs: Observer):
    def hook(mod: nn.Module, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.numel():
            obs.update(x)

    return hook


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
