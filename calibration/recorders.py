"""Forward hooks that collect calibration statistics, whatever loop runs the model.

The whole-model loop (calibration.forward) and the layer-by-layer loop
(calibration.sequential) install the same `Recorders` on modules found by
name, so both produce the same `CalibStats` for the same tokens. Names are the
checkpoint's (the plan's); `NameMap` finds the module transformers gives each
in memory (Qwen2.5-VL: `model.language_model.layers...`). Fused MoE experts have
no Linear per expert: calibration/moe.py runs them expert by expert and feeds
the same observers and Hessians under the per-expert names.
"""

from __future__ import annotations

import re
import time

import torch
from torch import nn

from tfcompile.calibration.awq_stats import AWQRecorder
from tfcompile.calibration.kv import KVObserver, install
from tfcompile.calibration.moe import MoERecorder
from tfcompile.calibration.moe_policy import resolve_amax
from tfcompile.calibration.observers import Observer, make_observer
from tfcompile.ir import CalibStats
from tfcompile.errors import CheckpointError
from tfcompile.families.names import NameMap


class Recorders:
    """Every hook of one calibration run; `remove()` them, then `stats()`."""

    def __init__(self, model: nn.Module, modules: set[str], *, observer: str = "max",
                 observer_params: dict | None = None,
                 hessian_groups: dict[str, str] | None = None, kv: bool = False,
                 awq_groups: dict[str, str] | None = None, all_experts: bool = False,
                 moe_min_tokens: int = 16):
        self.modules = set(modules)
        self.moe_min_tokens = moe_min_tokens
        names = NameMap(model)
        self.observers = {m: make_observer(observer, **(observer_params or {})) for m in sorted(self.modules)}
        in_memory = {names.to_model(m): m for m in self.modules}  # model module name -> checkpoint name
        self.hooks = []
        for name, mod in model.named_modules():
            if name in in_memory:
                self.hooks.append(mod.register_forward_pre_hook(_observe(self.observers[in_memory[name]])))
        self.hessians = HessianRecorder(model, hessian_groups or {}, names)
        self.hooks += self.hessians.hooks
        self.moe = MoERecorder(model, self._expert_input, all_experts=all_experts)
        self.awq = AWQRecorder(model, awq_groups or {})  # member -> group key; {} installs nothing
        self.hooks += self.awq.hooks
        self.kv = None
        if kv:
            self.kv = KVObserver(model)
            model.set_attn_implementation(install(self.kv, model))

    def _expert_input(self, name: str, x: torch.Tensor) -> None:
        """One expert's Linear input (calibration/moe.py), under the artifact's per-expert name."""
        if name in self.observers:
            self.observers[name].update(x)
        self.hessians.add(name, x)

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        self.moe.remove()
        if self.kv is not None:
            self.kv.remove()

    def stats(self, tokens: int, source: str, model_dir=None) -> CalibStats:
        """The statistics; with `kv`, raises if no attention call reached the KV observer."""
        if self.kv is not None and not self.kv.k:
            raise CheckpointError(f"{model_dir}: no attention call went through transformers' "
                                  "AttentionInterface, so KV-cache scales cannot be calibrated",
                                  hint="this architecture is not supported for --kv-cache yet")
        amax = {n: v for n, o in self.observers.items() if (v := o.amax()) is not None}
        resolved, fallback = resolve_amax(self.modules, amax, self.moe.seen, self.moe_min_tokens, model_dir)
        kv_amax = {} if self.kv is None else {n: (self.kv.k[n], self.kv.v[n]) for n in sorted(self.kv.k)}
        awq, awq_skipped = self.awq.result()  # after kv_amax: its fold check runs the model
        hessians = {k: h for k, h in self.hessians.result().items()
                    if _enough(k, self.moe.seen, self.moe_min_tokens)}  # too few tokens: RTN (quantize warns)
        return CalibStats(resolved, tokens, source, tuple(fallback), kv_amax, hessians=hessians,
                          hessian_seconds=dict(sorted(self.hessians.seconds.items())),
                          awq=awq, awq_skipped=awq_skipped, expert_tokens=dict(sorted(self.moe.tokens.items())),
                          moe_all_experts=self.moe.all_experts, moe_min_tokens=self.moe_min_tokens)


class HessianRecorder:
    """H = X^T X / n of each fusion group's input, recorded on one member (they share X).

    Memory: one float32 [K, K] per group observed so far."""

    def __init__(self, model: nn.Module, groups: dict[str, str], names: NameMap | None = None):
        self._h: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        self.groups = dict(groups)  # member Linear (checkpoint name) -> group key
        self.seconds: dict[str, float] = {}  # group key -> seconds spent accumulating its H
        in_memory = {(names.to_model(m) if names is not None else m): k for m, k in groups.items()}
        self.hooks = [mod.register_forward_pre_hook(self._hook(in_memory[name]))
                      for name, mod in model.named_modules() if name in in_memory]

    def _hook(self, key: str):
        def hook(mod: nn.Module, args):
            self._accumulate(key, args[0])

        return hook

    def add(self, member: str, x: torch.Tensor) -> None:
        """Input x of group member `member` (fused experts: calibration/moe.py)."""
        key = self.groups.get(member)
        if key is not None:
            self._accumulate(key, x)

    def _accumulate(self, key: str, x: torch.Tensor) -> None:
        t0 = time.perf_counter()
        x = x.detach().reshape(-1, x.shape[-1]).float()
        h = x.T @ x
        self._h[key] = h if key not in self._h else self._h[key] + h
        self._n[key] = self._n.get(key, 0) + x.shape[0]
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0

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


def _enough(key: str, tokens: dict[str, int], min_tokens: int) -> bool:
    """A fused expert's group keeps its Hessian only when min_tokens were routed to the expert."""
    m = re.match(r"(.*\.experts\.\d+)\.", key)
    return m is None or m.group(1) not in tokens or tokens[m.group(1)] >= min_tokens
