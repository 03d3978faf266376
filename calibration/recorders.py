"""Forward hooks that collect calibration statistics, whatever loop runs the model.

The whole-model loop (calibration.forward) and the layer-by-layer loop
(calibration.sequential) install the same `Recorders` on modules found by
name, so both produce the same `CalibStats` for the same tokens. Names are the
checkpoint's (the plan's); `NameMap` finds the module transformers gives each
in memory (Qwen2.5-VL: `model.language_model.layers...`). Fused MoE experts have
no Linear per expert: calibration/moe.py runs them expert by expert and feeds
the same observers and Hessians under the per-expert names.

Under torchrun (`world` of several ranks, each running its own batches): `max` observers and
the KV observer update locally and are reduced by an all-reduce MAX at the end (exact), routed
token counts by a sum; the Hessians and the other observers, whose floating-point result
depends on the order of updates, are folded on an owner rank in batch order
(tfcompile/dist/collect.py), after each round of batches (`flush`). Either way the statistics
are bit-identical to one process's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
import re
import time

import torch
from torch import nn

from tfcompile.calibration.awq_stats import AWQRecorder
from tfcompile.calibration.kv import KVObserver, install
from tfcompile.calibration.moe import MoERecorder
from tfcompile.calibration.moe_policy import resolve_amax
from tfcompile.calibration.observers import make_observer
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import OrderedReplay, max_tensors, max_values
from tfcompile.ir import CalibStats
from tfcompile.errors import CheckpointError
from tfcompile.families.experts import is_expert_group
from tfcompile.families.names import NameMap


@dataclass(frozen=True)
class HessianSpec:
    """How X^T X is recorded (calibrate.hessian_dtype, calibrate.hessian_blocks). `dtype`: what each
    batch's product and the running sum are computed in: float32 (the default, as llm-compressor's
    GPTQ), or the forwards' dtype (bf16: rounded to 8 bits of mantissa). `blocks` > 0: only the
    diagonal blocks x blocks sub-matrices, [K / blocks, blocks, blocks]: what a scale search scores
    with (passes/quantize/output_scales.py), K / blocks times less memory and time than the whole
    [K, K] GPTQ needs (a DeepSeek-V3 expert's down_proj: 0.9 MB instead of 217 MB)."""
    dtype: torch.dtype = torch.float32
    blocks: int = 0


class Recorders:
    """Every hook of one calibration run; `remove()` them, then `stats()`."""

    def __init__(self, model: nn.Module, modules: set[str], *, observer: str = "max",
                 observer_params: dict | None = None,
                 hessian_groups: dict[str, str] | None = None, kv: bool = False,
                 awq_groups: dict[str, str] | None = None, all_experts: bool = False,
                 moe_min_tokens: int = 16, world=LOCAL, hessian_owner: dict[str, int] | None = None,
                 hessian: HessianSpec = HessianSpec()):
        self.modules, self.world = set(modules), world
        self.moe_min_tokens = moe_min_tokens
        names = NameMap(model)
        self.observers = {m: make_observer(observer, **(observer_params or {})) for m in sorted(self.modules)}
        # order-sensitive observers are replayed on an owner (round robin); max reduces exactly
        self.replayed = set() if observer == "max" else set(self.observers)
        owners = {f"obs/{n}": i % world.size for i, n in enumerate(sorted(self.replayed))}
        owners.update({f"hess/{k}": r for k, r in (hessian_owner or {}).items()})
        awq_keys = sorted(set((awq_groups or {}).values()))  # AWQ statistics: round robin, like observers
        owners.update({f"awq/{k}": i % world.size for i, k in enumerate(awq_keys)})
        self.replay = OrderedReplay(world, owners)
        self._update = {m: self.replay.wrap(f"obs/{m}", o.update) if m in self.replayed else o.update
                        for m, o in self.observers.items()}
        in_memory = {names.to_model(m): m for m in self.modules}  # model module name -> checkpoint name
        self._ckpt_name = in_memory  # fused experts report model names (MiniMax-M2: mlp.experts.0.gate_proj = w1)
        self.hooks = []
        self._paused = False
        for name, mod in model.named_modules():
            if name in in_memory:
                self.hooks.append(mod.register_forward_pre_hook(_observe(self._update[in_memory[name]], self)))
        self.hessians = HessianRecorder(model, hessian_groups or {}, names, self.replay, spec=hessian)
        self.hooks += self.hessians.hooks
        self.moe = MoERecorder(model, self._expert_input, all_experts=all_experts)
        self.awq = AWQRecorder(model, awq_groups or {}, replay=self.replay)  # member -> group key; {}: no hooks
        self.hooks += self.awq.hooks
        self.kv = None
        if kv:
            self.kv = KVObserver(model)
            model.set_attn_implementation(install(self.kv, model))

    @contextlib.contextmanager
    def paused(self):
        """Run the model without recording anything: no observer, Hessian, KV or routed-token
        update (the layer loop re-runs a layer with its quantized weights: calibration/propagate.py)."""
        parts = [self, self.hessians, self.moe] + ([self.kv] if self.kv is not None else [])
        for p in parts:
            p._paused = True
        try:
            yield
        finally:
            for p in parts:
                p._paused = False

    def _expert_input(self, name: str, x: torch.Tensor) -> None:
        """One expert's Linear input (calibration/moe.py), under the artifact's per-expert name."""
        if self._paused:
            return
        name = self._ckpt_name.get(name, name)
        if name in self._update:
            self._update[name](x)
        self.hessians.add(name, x)

    def _ckpt_prefixes(self, tokens: dict[str, int]) -> dict[str, int]:
        """Per-expert token counts keyed "{model parent}.{e}" -> the checkpoint's "{parent}.{e}"."""
        prefix = {m.rpartition(".")[0]: c.rpartition(".")[0] for m, c in self._ckpt_name.items() if m != c}
        return {prefix.get(k, k): v for k, v in tokens.items()}

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        self.moe.remove()
        if self.kv is not None:
            self.kv.remove()

    def flush(self) -> None:
        """End of a round of batches (one per rank): replay the order-sensitive updates."""
        self.replay.flush()

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
        Under torchrun every rank gets the same amax and token counts; `hessians` holds the
        groups this rank owns (CalibStats.hessian_owner says which rank holds each)."""
        world = self.world
        kv_k = max_tensors(world, self.kv.k) if self.kv is not None else {}
        if self.kv is not None and not kv_k:
            raise CheckpointError(f"{model_dir}: no attention call went through transformers' "
                                  "AttentionInterface, so KV-cache scales cannot be calibrated",
                                  hint="this architecture is not supported for --kv-cache yet")
        kv_v = max_tensors(world, self.kv.v) if self.kv is not None else {}
        amax = max_values(world, {n: o.amax() for n, o in self.observers.items() if n not in self.replayed})
        mine = {n: self.observers[n].amax() for n in self.replayed}
        seconds, routed, seen, inline, spilled = {}, {}, {}, {}, {}
        parts = world.all_objects("calib/stats", (mine, sorted(self.hessians.result()), sorted(self.hessians.taken),
                                                  self.hessians.seconds, self.moe.tokens, self.moe.seen))
        for r, (part, kept, taken, secs, tok, sn) in enumerate(parts):
            amax.update({n: v for n, v in part.items() if self.replay.owners[f"obs/{n}"] == r})
            inline.update(dict.fromkeys(kept, r))
            spilled.update(dict.fromkeys(taken, r))
            for total, add in ((seconds, secs), (routed, tok), (seen, sn)):  # X^T X seconds, tokens: sums
                for k, v in add.items():
                    total[k] = total.get(k, 0) + v
        amax = {n: v for n, v in sorted(amax.items()) if v is not None}
        routed, seen = self._ckpt_prefixes(routed), self._ckpt_prefixes(seen)
        resolved, fallback = resolve_amax(self.modules, amax, seen, self.moe_min_tokens, model_dir)
        kv_amax = {n: (kv_k[n], kv_v[n]) for n in sorted(kv_k)}
        awq, awq_skipped = self.awq.result()  # after kv_amax: its fold check runs the model
        hessians = {k: h for k, h in self.hessians.result().items()
                    if enough_tokens(k, seen, self.moe_min_tokens)}  # too few tokens: RTN (quantize warns)
        # who holds which Hessian: the layer loop's spilled ones as they are (its per-layer take() is not
        # filtered), the whole-model loop's with the same moe_min_tokens filter as `hessians`
        owner = {**spilled, **{k: r for k, r in inline.items() if enough_tokens(k, seen, self.moe_min_tokens)}}
        return CalibStats(resolved, tokens, source, tuple(fallback), kv_amax, hessians=hessians,
                          hessian_seconds=dict(sorted(seconds.items())),
                          awq=awq, awq_skipped=awq_skipped, expert_tokens=dict(sorted(routed.items())),
                          moe_all_experts=self.moe.all_experts, moe_min_tokens=self.moe_min_tokens,
                          hessian_owner=owner if world.distributed else {})


class HessianRecorder:
    """H = X^T X / n of each fusion group's input, recorded on one member (they share X).

    Memory: one float32 [K, K] per group observed so far (under torchrun: per group this rank
    owns). A routed expert's batch (T_e rows, a few hundred) is much smaller than its K x K
    partial, so under torchrun an expert group's rows X_b travel to the owner, which computes
    X_b^T X_b there; other groups send the partial (module docstring of tfcompile/dist/collect.py).
    One process computes and adds the same products in the same order either way.
    `spec` (HessianSpec): what X^T X is computed and summed in, and whether only its diagonal blocks
    are; `result()` hands float32 to the solve either way."""

    def __init__(self, model: nn.Module, groups: dict[str, str], names: NameMap | None = None, replay=None,
                 spec: HessianSpec = HessianSpec()):
        self.spec = spec
        self._h: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        self._paused = False  # Recorders.paused()
        self.groups = dict(groups)  # member Linear (checkpoint name) -> group key
        self.taken: set[str] = set()  # keys handed out by take() (spilled by the layer loop)
        self.seconds: dict[str, float] = {}  # group key -> seconds spent computing X^T X
        route = replay.wrap if replay is not None else (lambda key, fold, prep: lambda x: fold(*prep(x)))
        # x -> H += X^T X: under torchrun X_b^T X_b on the batch's rank, the sum on the owner
        self._route = {k: route(f"hess/{k}", self._fold(k), self._prepare(k)) for k in sorted(set(groups.values()))}
        in_memory = {(names.to_model(m) if names is not None else m): k for m, k in groups.items()}
        self.hooks = [mod.register_forward_pre_hook(_first_arg(self._route[in_memory[name]], self))
                      for name, mod in model.named_modules() if name in in_memory]

    def add(self, member: str, x: torch.Tensor) -> None:
        """Input x of group member `member` (fused experts: calibration/moe.py)."""
        key = self.groups.get(member)
        if key is not None and not self._paused:
            self._route[key](x)

    def _prepare(self, key: str):
        """One batch's X^T X (in `dtype`, on x's device) and its row count: the expensive part, on the
        batch's rank; a routed expert's rows X_b [T_e, K] as they are (the owner multiplies)."""
        def prepare(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = x.detach().reshape(-1, x.shape[-1])
            if is_expert_group(key):
                return x, torch.tensor([x.shape[0]])
            return self._product(key, x), torch.tensor([x.shape[0]])

        return prepare

    def _product(self, key: str, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        x = x.to(self.spec.dtype)
        if self.spec.blocks:  # [T, K] -> [K / b, T, b]: each block's own b x b product
            xb = x.reshape(x.shape[0], -1, self.spec.blocks).transpose(0, 1)
            h = xb.transpose(1, 2) @ xb  # [K / b, b, b]
        else:
            h = x.T @ x
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
        return h

    def _fold(self, key: str):
        """H = H + X_b^T X_b in batch order (on the group's owner rank under torchrun)."""
        def fold(h: torch.Tensor, rows: torch.Tensor) -> None:
            h = self._product(key, h) if is_expert_group(key) else h  # an expert's rows X_b
            self._h[key] = h if key not in self._h else self._h[key] + h
            self._n[key] = self._n.get(key, 0) + int(rows)

        return fold

    def result(self) -> dict[str, torch.Tensor]:
        return {k: self._h[k].float() / self._n[k] for k in sorted(self._h)}

    def rows(self) -> dict[str, int]:
        """Input rows (tokens) behind each Hessian so far: a routed expert's are its tokens."""
        return dict(sorted(self._n.items()))

    def take(self) -> dict[str, torch.Tensor]:
        """The finished Hessians so far, forgotten here (the layer loop spills them)."""
        out = self.result()
        self.taken.update(out)
        self._h.clear()
        self._n.clear()
        return out


def _observe(update, owner):
    def hook(mod: nn.Module, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.numel() and not owner._paused:
            update(x)

    return hook


def _first_arg(update, owner):
    return lambda mod, args: None if owner._paused else update(args[0])


def enough_tokens(key: str, tokens: dict[str, int], min_tokens: int) -> bool:
    """A fused expert's group keeps its Hessian only when min_tokens were routed to the expert."""
    m = re.match(r"(.*\.experts\.\d+)\.", key)
    return m is None or m.group(1) not in tokens or tokens[m.group(1)] >= min_tokens
