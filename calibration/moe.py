"""MoE calibration: per-expert statistics from fused transformers v5 experts.

transformers 5 runs a layer's routed experts as one module over 3-D parameters
(`gate_up_proj`, `down_proj`), so there is no Linear per expert to hook: a
forward pre-hook sees the whole layer's tokens, not what each expert received, and
never sees a down_proj input at all. We register our own experts function in
transformers' `ExpertsInterface` (selected with `set_experts_implementation`, the
way calibration/kv.py selects an attention function) that computes each expert
exactly as transformers' eager loop does, for every layout
(tfcompile/families/experts.py: v5 halves, GPT-OSS interleaved + transposed +
biases, via the module's own `_apply_gate`), and hands each expert's inputs to
the recorders under the per-expert Linear names the artifact uses:

  {parent}.{e}.gate_proj / up_proj   <- the tokens routed to expert e   [T_e, H]
  {parent}.{e}.down_proj             <- _apply_gate(gate_up(x))         [T_e, I]

`all_experts=True` (`--calib-all-experts`) also sends every token through every
expert for the statistics only (observers and Hessians see all T tokens); the
layer's output is still computed from the routed tokens alone, so routing and
every later layer are exactly as without it. The manifest's `moe.expert_tokens` are
the routed counts either way; `seen` (what the fallback policy and GPTQ's threshold
read) counts the tokens an expert's statistics saw: all of them with all_experts.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from tfcompile.families.experts import experts_modules

IMPL = "tfcompile_moe_calibration"
# on_input(expert Linear name, x [T, K]) -> None
Hook = Callable[[str, torch.Tensor], None]


class MoERecorder:
    """Per-expert routed token counts, and per-expert inputs handed to `on_input`.

    `transform(expert Linear name, x) -> x'` (optional) replaces what each expert's gate/up and
    down_proj see in the routed forward: `tfcompile eval` emulates per-expert activation
    quantization with it (tfcompile/evaluate/models.py)."""

    def __init__(self, model: nn.Module, on_input: Hook, *, all_experts: bool = False, transform=None,
                 impl: str = IMPL):
        self.parents = {id(m): n for n, m in experts_modules(model).items()}
        self.on_input, self.all_experts, self.transform, self.impl = on_input, all_experts, transform, impl
        self.tokens: dict[str, int] = {}  # per-expert module prefix "{parent}.{e}" -> routed tokens
        for name, mod in experts_modules(model).items():
            self.tokens.update({f"{name}.{e}": 0 for e in range(mod.gate_up_proj.shape[0])})
        self.seen = dict(self.tokens)  # tokens in each expert's statistics (all tokens with all_experts)
        self._paused = False  # Recorders.paused(): route and compute, count and observe nothing
        self._model = model
        self._previous = getattr(getattr(model, "config", None), "_experts_implementation", None)
        if self.parents:
            install(self, impl)
            model.set_experts_implementation(impl)

    def remove(self) -> None:
        if self.parents and self._previous:
            self._model.set_experts_implementation(self._previous)

    def forward(self, mod: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """transformers' eager experts loop, observing each expert's inputs on the way."""
        parent = self.parents[id(mod)]
        n_exp = mod.gate_up_proj.shape[0]
        out = torch.zeros_like(hidden)
        with torch.no_grad():
            mask = F.one_hot(top_k_index, num_classes=n_exp + 1).permute(2, 1, 0)  # [E+1, k, T]
        for e in range(n_exp):
            top_k_pos, token_idx = torch.where(mask[e])
            if not self._paused:
                self.tokens[f"{parent}.{e}"] += int(token_idx.numel())
                self.seen[f"{parent}.{e}"] += int(hidden.shape[0] if self.all_experts else token_idx.numel())
            if self.all_experts and not self._paused:  # statistics of every token; the output stays the routed one
                expert_mlp(mod, e, hidden, lambda kind, x, e=e: self._observe(parent, e, kind, x))
            if token_idx.numel() == 0:
                continue
            y = expert_mlp(mod, e, hidden[token_idx], lambda kind, x, e=e: self._routed(parent, e, kind, x))
            y = y * top_k_weights[token_idx, top_k_pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out

    def _routed(self, parent: str, e: int, kind: str, x: torch.Tensor) -> torch.Tensor:
        if not self.all_experts:
            self._observe(parent, e, kind, x)
        if self.transform is None:
            return x
        return self.transform(f"{parent}.{e}.{'gate_proj' if kind == 'gate_up' else 'down_proj'}", x)

    def _observe(self, parent: str, e: int, kind: str, x: torch.Tensor) -> None:
        if not x.numel():
            return
        names = ("gate_proj", "up_proj") if kind == "gate_up" else ("down_proj",)
        for proj in names:
            self.on_input(f"{parent}.{e}.{proj}", x)


def expert_mlp(mod: nn.Module, e: int, x: torch.Tensor, hook=None) -> torch.Tensor:
    """Expert e of a fused experts module on x [T, H] -> [T, H], as transformers' eager loop
    computes it; `hook(kind, input)` sees the gate_up input and the down_proj input, and what it
    returns (a tensor) is used in their place."""
    if hook is not None:
        x = _or(hook("gate_up", x), x)
    transposed = bool(getattr(mod, "is_transposed", False))
    bias = bool(getattr(mod, "has_bias", False))
    gu = x @ mod.gate_up_proj[e] if transposed else F.linear(x, mod.gate_up_proj[e])
    if bias:
        gu = gu + mod.gate_up_proj_bias[e]
    h = mod._apply_gate(gu)
    if hook is not None:
        h = _or(hook("down", h), h)
    y = h @ mod.down_proj[e] if transposed else F.linear(h, mod.down_proj[e])
    return y + mod.down_proj_bias[e] if bias else y


def _or(value, default):
    return default if value is None else value


def install(recorder: MoERecorder, impl: str = IMPL) -> None:
    """Register the observing experts function in transformers' ExpertsInterface (re-registered
    per run, as calibration/kv.py does for attention: the registry is transformers')."""
    # lazy: transformers (~2 s to import); only when a model is built
    from transformers.integrations.moe import ExpertsInterface

    def observing(mod, hidden_states, top_k_index, top_k_weights):
        return recorder.forward(mod, hidden_states, top_k_index, top_k_weights)

    ExpertsInterface.register(impl, observing)


def manifest_record(stats) -> dict | None:
    """The manifest's `moe` section: routed tokens per expert, the policy and who fell back."""
    if not getattr(stats, "expert_tokens", None):
        return None
    per: dict[str, dict[int, int]] = {}
    for key, n in stats.expert_tokens.items():
        parent, _, e = key.rpartition(".")
        per.setdefault(parent, {})[int(e)] = n
    return {"all_experts": stats.moe_all_experts, "min_tokens": stats.moe_min_tokens,
            "expert_tokens": {p: [c[e] for e in sorted(c)] for p, c in sorted(per.items())},
            "below_min_tokens": [] if stats.moe_all_experts else
            sorted(k for k, n in stats.expert_tokens.items() if n < stats.moe_min_tokens)}
