"""Measured sensitivity: the KL of the model's output when one fusion group alone is quantized.

For every fusion group and every candidate format, the group's weights are replaced by their
round-to-nearest quantization in that format (the quantizers pack uses: Scheme.weights,
NVFP4's shared group global scale included) and its inputs are quantized as that format's
activations are at inference (tfcompile eval's emulation, static scales from the max |x| seen
on these tokens); the cost is the mean KL(reference || model) of the next-token distribution
over `samples x seq_len` calibration tokens.

Cost: one forward of the decoder layers from the group's layer on (the layers before it replay
their recorded outputs), per group and format: about (groups x formats / 2) forwards of the
tokens. The whole model is loaded (bf16 on CPU for SmolLM2-135M: 270 MB).
"""

from __future__ import annotations

import re
import time

import torch
from torch import nn

from tfcompile.calibration.forward import calibration_ids, load_hf_model, resolve_data
from tfcompile.calibration.sequential import find_layers
from tfcompile.evaluate.actquant import pre_hook
from tfcompile.kernels import formats as F
from tfcompile.mixed.search import GroupCost
from tfcompile.schemes import Scheme, get_scheme


class _Replay(nn.Module):
    """Stands in for a decoder layer whose output is already known."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def forward(self, *args, **kwargs):
        return self.out


class Runner:
    """The model on fixed tokens: reference log-probs, each layer's output and each Linear's input
    max |x|, recorded once; `kl(...)` reruns only the layers from a given one on."""

    def __init__(self, model: nn.Module, ids: torch.Tensor):
        self.model, self.ids = model, ids
        self.path, self.layers = find_layers(model)
        self.outputs: list = [None] * len(self.layers)
        self.amax: dict[str, float] = {}
        hooks = [layer.register_forward_hook(self._keep(i)) for i, layer in enumerate(self.layers)]
        hooks += [m.register_forward_pre_hook(self._observe(n)) for n, m in model.named_modules()
                  if isinstance(m, nn.Linear)]
        try:
            with torch.inference_mode():
                self.ref = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        finally:
            for h in hooks:
                h.remove()

    def _keep(self, i: int):
        def hook(_mod, _args, out):
            self.outputs[i] = out
        return hook

    def _observe(self, name: str):
        def hook(_mod, args):
            self.amax[name] = max(self.amax.get(name, 0.0), float(args[0].detach().abs().max()))
        return hook

    def layer_of(self, module: str) -> int:
        m = re.match(re.escape(self.path) + r"\.(\d+)\.", module)
        if m is None:
            raise ValueError(f"{module} is not inside {self.path}")
        return int(m.group(1))

    def kl(self, first_layer: int) -> float:
        """Mean KL(reference || model) with layers before `first_layer` replaying their outputs."""
        saved = [self.layers[j] for j in range(first_layer)]
        for j in range(first_layer):
            self.layers[j] = _Replay(self.outputs[j])
        try:
            with torch.inference_mode():
                lp = torch.log_softmax(self.model(input_ids=self.ids).logits.float(), -1)
        finally:
            for j, layer in enumerate(saved):
                self.layers[j] = layer
        return float((self.ref.exp() * (self.ref - lp)).sum(-1).clamp_min(0).mean())


def measure(model_dir, plan, formats: list[str], *, data: str, samples: int, seq_len: int, seed: int,
            dtype: torch.dtype, mx_rule: str, reporter=None) -> tuple[list[GroupCost], dict]:
    """Per fusion group: its weight count and the KL with it alone in each of `formats` (the plan's
    own format included; "bf16" costs 0). Returns (costs, a JSON-able record of the measurement)."""
    t0 = time.perf_counter()
    model = load_hf_model(model_dir, dtype)
    data, tok = resolve_data(model_dir, model, data, samples, seq_len)
    ids = calibration_ids(model_dir, model, data=data, samples=samples, seq_len=seq_len, seed=seed, tokenizer=tok)
    run = Runner(model, ids)
    modules = dict(model.named_modules())
    names = [plan.scheme.name] + [f for f in formats if f != plan.scheme.name]
    if reporter is not None:
        reporter.task("mixed: sensitivity", len(plan.groups))
    costs = []
    for g in plan.groups:
        mods = [modules.get(t.module) for t in g.members]
        params = sum(t.shape[0] * t.shape[1] for t in g.members)
        if not all(isinstance(m, nn.Linear) for m in mods):  # fused MoE experts: not measured, stays base
            costs.append(GroupCost(g.key, params, {f: 0.0 for f in names}))
            continue
        kl = {}
        for fmt in names:
            if fmt == "bf16":
                kl[fmt] = 0.0
            elif all(t.shape[1] % get_scheme(fmt).k_multiple == 0 for t in g.members):
                with _quantized(g, mods, get_scheme(fmt), run.amax, mx_rule, dtype):
                    kl[fmt] = run.kl(run.layer_of(g.members[0].module))
        costs.append(GroupCost(g.key, params, kl))
        if reporter is not None:
            reporter.advance(1, g.key)
    record = {"data": f"{data}(seed={seed})", "tokens": int(ids.numel()), "formats": names,
              "seconds": round(time.perf_counter() - t0, 1)}
    return costs, record


class _quantized:
    """Context: the group's Linears hold their `scheme` RTN weights and quantize their inputs."""

    def __init__(self, group, mods, scheme: Scheme, amax: dict, mx_rule: str, dtype: torch.dtype):
        self.mods, self.saved, self.hooks = mods, [m.weight.data for m in mods], []
        ws = [m.weight.data.float() for m in mods]
        wq = scheme.weights  # the quantizer pack uses (kernels/formats/quantizer.py), RTN
        g = wq.group_global_scale(ws, [t.source for t in group.members])
        rule = mx_rule or wq.default_rule
        self.new = [F.dequantize(wq.quantize(w, global_scale=g, rule=rule, scale_dtype=dtype, name=t.source),
                                 torch.float32).to(dtype) for t, w in zip(group.members, ws)]
        a = max(amax.get(t.module, 0.0) for t in group.members)
        self.act = None if scheme.acts is None else scheme.acts.emulate(a, dtype, name=group.key)

    def __enter__(self):
        for m, w in zip(self.mods, self.new):
            m.weight.data = w
            if self.act is not None:
                self.hooks.append(m.register_forward_pre_hook(pre_hook(self.act)))

    def __exit__(self, *exc):
        for m, w in zip(self.mods, self.saved):
            m.weight.data = w
        for h in self.hooks:
            h.remove()
