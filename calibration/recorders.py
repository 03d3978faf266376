"""Forward hooks that collect calibration statistics, whatever loop runs the model.

The whole-model loop (calibration.forward) and the layer-by-layer loop
(calibration.sequential) install the same `Recorders` on modules found by
name, so both produce the same `CalibStats` for the same tokens. Names are the
checkpoint's (the plan's); `NameMap` finds the module transformers gives each
in memory (Qwen2.5-VL: `model.language_model.layers...`). Fused MoE experts have
no Linear per expert: calibration/moe.py runs them expert by expert and feeds
the same observers and statistics under the per-expert names.

Under torchrun (`world` of several ranks, each running its own batches): `max` observers and
the KV observer update locally and are reduced by an all-reduce MAX at the end (exact), routed
token counts by a sum; the other observers and the registered statistics, whose floating-point
result depends on the order of updates, are folded on an owner rank in batch order
(tfcompile/dist/collect.py), after each round of batches (`flush`). Either way the statistics
are bit-identical to one process's.

The statistics an algorithm needs are not named here: each is registered by its own module
(calibration/statistics.py `register_statistic`) and recorded when the run asks for it by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tfcompile.calibration.kv import KVObserver, install
from tfcompile.calibration.moe import MoERecorder
from tfcompile.calibration.moe_policy import resolve_amax
from tfcompile.calibration.observers import make_observer
from tfcompile.calibration.statistics import STATISTICS, Setup, enough_tokens, expert_rows, held, joined
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import OrderedReplay, max_tensors, max_values
from tfcompile.ir import CalibStats
from tfcompile.errors import CheckpointError
from tfcompile.families.names import NameMap


class Recorders:
    """Every hook of one calibration run; `remove()` them, then `stats()`.

    `statistics`: name -> options of the registered statistics to record (calibration/statistics.py);
    `groups`: every quantized Linear (checkpoint name) -> its fusion-group key; `owner`: group key ->
    the rank that folds a per-group statistic's tensor under torchrun (default: round robin);
    `compute_dtype`: what the forwards compute in (a statistic may compute in it)."""

    def __init__(self, model: nn.Module, modules: set[str], *, observer: str = "max",
                 observer_params: dict | None = None, kv: bool = False,
                 statistics: Mapping[str, Mapping[str, Any]] | None = None, groups: Mapping[str, str] | None = None,
                 all_experts: bool = False, moe_min_tokens: int = 16, world=LOCAL,
                 owner: Mapping[str, int] | None = None, compute_dtype: torch.dtype = torch.float32):
        self.modules, self.world = set(modules), world
        self.moe_min_tokens = moe_min_tokens
        names = NameMap(model)
        self.observers = {m: make_observer(observer, **(observer_params or {})) for m in sorted(self.modules)}
        # order-sensitive observers are replayed on an owner (round robin); max reduces exactly
        self.replayed = set() if observer == "max" else set(self.observers)
        self.replay = OrderedReplay(world, {f"obs/{n}": i % world.size for i, n in enumerate(sorted(self.replayed))})
        self._update = {m: self.replay.wrap(f"obs/{m}", o.update) if m in self.replayed else o.update
                        for m, o in self.observers.items()}
        in_memory = {names.to_model(m): m for m in self.modules}  # model module name -> checkpoint name
        self._ckpt_name = in_memory  # fused experts report model names (MiniMax-M2: mlp.experts.0.gate_proj = w1)
        self.hooks = []
        self._paused = False
        for name, mod in model.named_modules():
            if name in in_memory:
                self.hooks.append(mod.register_forward_pre_hook(_observe(self._update[in_memory[name]], self)))
        self.recorders = {}  # statistic name -> its recorder, in name order (collectives follow it)
        keys = sorted(set((groups or {}).values()))
        owner = {k: (owner or {}).get(k, i % world.size) for i, k in enumerate(keys)}
        for name in sorted(statistics or {}):
            setup = Setup(model, names, dict(groups or {}), self.replay, dict(statistics[name] or {}), owner,
                          compute_dtype)
            self.recorders[name] = STATISTICS[name].factory(setup)
        self.taken: dict[str, set[str]] = {}  # per-group statistic -> keys handed out by take() (spilled)
        self.moe = MoERecorder(model, self._expert_input, all_experts=all_experts)
        self.kv = None
        if kv:
            self.kv = KVObserver(model)
            model.set_attn_implementation(install(self.kv, model))

    @contextlib.contextmanager
    def paused(self):
        """Run the model without recording anything: no observer, statistic, KV or routed-token
        update (the layer loop re-runs a layer with its quantized weights: calibration/propagate.py)."""
        parts = [self, self.moe] + ([self.kv] if self.kv is not None else [])
        for p in parts:
            p._paused = True
        for r in self.recorders.values():
            r.paused = True
        try:
            yield
        finally:
            for p in parts:
                p._paused = False
            for r in self.recorders.values():
                r.paused = False

    def begin(self, ids: torch.Tensor) -> None:
        """The calibration token ids [samples, seq_len], before the first batch (every rank)."""
        for r in self.recorders.values():
            r.begin(ids)

    def _expert_input(self, name: str, x: torch.Tensor) -> None:
        """One expert's Linear input (calibration/moe.py), under the artifact's per-expert name."""
        if self._paused:
            return
        name = self._ckpt_name.get(name, name)
        if name in self._update:
            self._update[name](x)
        for r in self.recorders.values():
            r.add(name, x)

    def _ckpt_prefixes(self, tokens: dict[str, int]) -> dict[str, int]:
        """Per-expert token counts keyed "{model parent}.{e}" -> the checkpoint's "{parent}.{e}"."""
        prefix = {m.rpartition(".")[0]: c.rpartition(".")[0] for m, c in self._ckpt_name.items() if m != c}
        return {prefix.get(k, k): v for k, v in tokens.items()}

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        for r in self.recorders.values():
            r.remove()
        self.moe.remove()
        if self.kv is not None:
            self.kv.remove()

    def flush(self) -> None:
        """End of a round of batches (one per rank): replay the order-sensitive updates."""
        self.replay.flush()

    def per_group(self) -> list[str]:
        return [n for n in self.recorders if STATISTICS[n].per_group]

    def take(self, min_tokens: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """A finished layer: per-group statistic -> its tensors so far, forgotten by the recorders;
        with `min_tokens`, less the routed experts' that saw fewer tokens (their groups stay RTN)."""
        out = {}
        for name in self.per_group():
            r = self.recorders[name]
            tokens = expert_rows(r.rows())  # a routed expert's rows are its tokens
            out[name] = {k: t for k, t in r.take().items()
                         if min_tokens is None or enough_tokens(k, tokens, min_tokens)}
            self.taken.setdefault(name, set()).update(out[name])
        return out

    def amax_now(self, modules, tag: str) -> dict[str, float]:
        """Module -> its input amax so far, for the `modules` that have an observer and saw a token;
        what `stats` would give them, reduced over ranks the same way (collective under torchrun:
        every rank calls it with the same `tag`). The layer loop reads a finished layer's amax to
        fake-quantize its inputs when it reruns it (calibration/propagate.py)."""
        names = sorted(m for m in modules if m in self.observers)
        amax = max_values(self.world, {n: self.observers[n].amax() for n in names if n not in self.replayed})
        mine = {n: self.observers[n].amax() for n in names
                if n in self.replayed and self.replay.owners[f"obs/{n}"] == self.world.rank}
        for part in self.world.all_objects(f"calib/amax/{tag}", mine):
            amax.update(part)
        return {n: v for n, v in sorted(amax.items()) if v is not None}

    def stats(self, tokens: int, source: str, model_dir=None) -> CalibStats:
        """The statistics; with `kv`, raises if no attention call reached the KV observer.
        Under torchrun every rank gets the same amax and token counts; a per-group statistic holds
        the groups this rank owns, in a mapping that says which rank holds each (statistics.held)."""
        world = self.world
        kv_k = max_tensors(world, self.kv.k) if self.kv is not None else {}
        if self.kv is not None and not kv_k:
            raise CheckpointError(f"{model_dir}: no attention call went through transformers' "
                                  "AttentionInterface, so KV-cache scales cannot be calibrated",
                                  hint="this architecture is not supported for --kv-cache yet")
        kv_v = max_tensors(world, self.kv.v) if self.kv is not None else {}
        amax = max_values(world, {n: o.amax() for n, o in self.observers.items() if n not in self.replayed})
        mine = {n: self.observers[n].amax() for n in self.replayed}
        per_group = self.per_group()
        own = {n: self.recorders[n].result() for n in per_group}  # this rank's, inline (not taken)
        kept = {n: sorted(own[n]) for n in per_group}
        taken = {n: sorted(self.taken.get(n, ())) for n in per_group}
        seconds = {n: r.seconds() for n, r in self.recorders.items()}
        parts = world.all_objects("calib/stats", (mine, kept, taken, seconds, self.moe.tokens, self.moe.seen))
        inline, spilled = {n: {} for n in per_group}, {n: {} for n in per_group}
        total_seconds, routed, seen = {n: {} for n in self.recorders}, {}, {}
        for r, (part, kp, tk, secs, tok, sn) in enumerate(parts):
            amax.update({n: v for n, v in part.items() if self.replay.owners[f"obs/{n}"] == r})
            for n in per_group:
                inline[n].update(dict.fromkeys(kp[n], r))
                spilled[n].update(dict.fromkeys(tk[n], r))
            for total, add in [(total_seconds[n], s) for n, s in secs.items()] + [(routed, tok), (seen, sn)]:
                for k, v in add.items():  # seconds, tokens: sums
                    total[k] = total.get(k, 0) + v
        amax = {n: v for n, v in sorted(amax.items()) if v is not None}
        routed, seen = self._ckpt_prefixes(routed), self._ckpt_prefixes(seen)
        resolved, fallback = resolve_amax(self.modules, amax, seen, self.moe_min_tokens, model_dir)
        kv_amax = {n: (kv_k[n], kv_v[n]) for n in sorted(kv_k)}
        results = {}
        for n in sorted(self.recorders):  # after kv_amax: a statistic's result may run the model
            if n not in per_group:
                results[n] = self.recorders[n].result()
                continue
            enough = lambda k: enough_tokens(k, seen, self.moe_min_tokens)  # noqa: E731 - too few tokens: RTN
            result = {k: t for k, t in own[n].items() if enough(k)}
            # who holds which key: the layer loop's spilled ones as they are (its per-layer take() is not
            # filtered), the whole-model loop's with the same moe_min_tokens filter as the result
            owner = {**spilled[n], **{k: r for k, r in inline[n].items() if enough(k)}}
            results[n] = held(result, owner, world)
        return CalibStats(resolved, tokens, source, tuple(fallback), kv_amax, statistics=results,
                          seconds={n: dict(sorted(s.items())) for n, s in total_seconds.items() if s},
                          expert_tokens=dict(sorted(routed.items())),
                          moe_all_experts=self.moe.all_experts, moe_min_tokens=self.moe_min_tokens)


def merge_stats(main: CalibStats, extra: CalibStats) -> CalibStats:
    """`main` with what another run over the same tokens recorded for other modules (`extra`: the
    MTP layers', tfcompile/draft/mtp_calibrate.py): amax, fallbacks, per-group statistics, seconds,
    routed tokens. A statistic that is not per group stays `main`'s."""
    stats = dict(main.statistics)
    for n, r in extra.statistics.items():
        if STATISTICS[n].per_group:
            stats[n] = joined(stats.get(n), r)
    seconds = {n: {**main.seconds.get(n, {}), **extra.seconds.get(n, {})} for n in {*main.seconds, *extra.seconds}}
    return dataclasses.replace(main, input_amax=dict(sorted({**main.input_amax, **extra.input_amax}.items())),
                               fallback=main.fallback + extra.fallback, statistics=stats,
                               seconds=dict(sorted(seconds.items())),
                               expert_tokens=dict(sorted({**main.expert_tokens, **extra.expert_tokens}.items())))


def _observe(update, owner):
    def hook(mod: nn.Module, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.numel() and not owner._paused:
            update(x)

    return hook
