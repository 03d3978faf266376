"""Sensitivity at the cost of a calibration: a Fisher estimate of each group's KL from one backward.

`mixed.sensitivity=fisher` (the default). For the next-token distribution p of the model and a
small change dY of one Linear's output, KL(p || p') ~= 1/2 dY^T F dY, where F is the Fisher
information of p with respect to that output. One forward and one backward give it for every
Linear at once: the labels y_t are drawn from the model's own p(. | x_<t) (seeded), the loss is
-sum_t log p(y_t), and each Linear's output gradient G [B, T, N] scores any perturbation dY by
the diagonal estimate 1/2 sum_{t,n} G^2 dY^2 (per token: divided by B x T). That is the score of
NVIDIA modelopt's AutoQuantize (squared output gradient times squared output difference), with
labels sampled from the reference instead of the data, so that it estimates the KL to the
reference the search budgets. dY = q(X) W_q^T - X W^T: the group's RTN weights in the format
(the quantizers pack uses, the fused group's shared global scale included) and, for W4A4 and
W8A8 formats, its inputs fake-quantized as at inference (static scales from these tokens' max).

Cost: one forward and one backward over `samples x seq_len` tokens, plus one matmul per Linear
and candidate format when its gradient arrives (about one more forward per format); the exact
measurement (`sensitivity.py`, `mixed.sensitivity=kl`) runs about groups x formats / 2 forwards.
Memory: each Linear's input is kept from its forward until its gradient arrives (the backward
frees them in reverse order), in the model dtype.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from tfcompile.calibration.forward import calibration_ids, load_hf_model, resolve_data
from tfcompile.kernels import formats as F
from tfcompile.mixed.search import GroupCost
from tfcompile.schemes import get_scheme


class _Member:
    """One Linear of a group: its candidate formats' dequantized weights, made when scored."""

    def __init__(self, module: nn.Linear, source: str, group_scales: dict):
        # group_scales: format -> the group's shared global scale, for the formats its shapes fit
        self.module, self.source, self.group_scales = module, source, group_scales
        self.x: torch.Tensor | None = None
        self.score: dict[str, float] = {}

    def weight(self, fmt: str, rule: str, dtype: torch.dtype) -> torch.Tensor:
        wq = get_scheme(fmt).weights
        w = self.module.weight.detach().float()
        q = wq.quantize(w, global_scale=self.group_scales[fmt], rule=rule or wq.default_rule, scale_dtype=dtype,
                        name=self.source)
        return F.dequantize(q, torch.float32)


def _group_scales(group, modules: dict, fmts: list[str]) -> dict:
    ws = [modules[t.module].weight.detach().float() for t in group.members]
    return {f: get_scheme(f).weights.group_global_scale(ws, [t.source for t in group.members]) for f in fmts}


def _score(m: _Member, g: torch.Tensor, rule: str, dtype: torch.dtype) -> None:
    """Add 1/2 sum G^2 dY^2 of each format the member fits to m.score (G: the output's gradient)."""
    x = m.x.float()
    y = x @ m.module.weight.detach().float().t()
    g2, amax = g.float().square(), float(x.abs().max())
    for fmt in m.group_scales:
        acts = get_scheme(fmt).acts
        xq = x if acts is None else acts.emulate(amax, torch.float32, name=m.source)(x)
        dy = xq @ m.weight(fmt, rule, dtype).t() - y
        m.score[fmt] = m.score.get(fmt, 0.0) + 0.5 * float((g2 * dy.square()).sum())
    m.x = None


def _hooks(members: dict[str, _Member], rule: str, dtype: torch.dtype) -> list:
    def fwd(m: _Member):
        def hook(_mod, args, out):
            m.x = args[0].detach()
            out.register_hook(lambda g: _score(m, g, rule, dtype))
        return hook
    return [m.module.register_forward_hook(fwd(m)) for m in members.values()]


def measure_fisher(model_dir, plan, formats: list[str], *, data: str, samples: int, seq_len: int, seed: int,
                   dtype: torch.dtype, mx_rule: str, reporter=None) -> tuple[list[GroupCost], dict]:
    """Per fusion group: its weight count and the estimated KL with it alone in each of `formats`
    (the plan's own format included; "bf16" costs 0). Same contract as sensitivity.measure."""
    t0 = time.perf_counter()
    model = load_hf_model(model_dir, dtype).requires_grad_(False)
    data, tok = resolve_data(model_dir, model, data, samples, seq_len)
    ids = calibration_ids(model_dir, model, data=data, samples=samples, seq_len=seq_len, seed=seed, tokenizer=tok)
    modules = dict(model.named_modules())
    names = [plan.scheme.name] + [f for f in formats if f != plan.scheme.name]
    quantized = [f for f in names if f != "bf16"]
    members, groups = {}, []
    for g in plan.groups:
        mods = [modules.get(t.module) for t in g.members]
        fits = [f for f in quantized if all(t.shape[1] % get_scheme(f).k_multiple == 0 for t in g.members)]
        if all(isinstance(m, nn.Linear) for m in mods):  # fused MoE experts: not measured, stay base
            scales = _group_scales(g, modules, fits)
            members.update({t.module: _Member(modules[t.module], t.source, scales) for t in g.members})
        groups.append((g, fits))
    if reporter is not None:
        reporter.task("mixed: sensitivity (one forward + backward)", None)
    hooks = _hooks(members, mx_rule, dtype)
    try:
        _forward_backward(model, ids, seed)
    finally:
        for h in hooks:
            h.remove()
    tokens = ids.numel()
    costs = []
    for g, fits in groups:
        params = sum(t.shape[0] * t.shape[1] for t in g.members)
        ms = [members.get(t.module) for t in g.members]
        if None in ms:  # not measured: every format costs nothing, the group stays in the base
            kl = {f: 0.0 for f in names}
        else:
            kl = {**{f: 0.0 for f in names if f == "bf16"},
                  **{f: sum(m.score.get(f, 0.0) for m in ms) / tokens for f in fits}}
        costs.append(GroupCost(g.key, params, kl))
    record = {"method": "fisher", "data": f"{data}(seed={seed})", "tokens": int(tokens), "formats": names,
              "seconds": round(time.perf_counter() - t0, 1)}
    return costs, record


def _forward_backward(model: nn.Module, ids: torch.Tensor, seed: int) -> None:
    """One forward with gradients to the activations and one backward of -sum log p(y), y ~ p."""
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = model(inputs_embeds=emb, use_cache=False).logits.float()
    logp = torch.log_softmax(logits, -1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        y = torch.multinomial(logp.exp().reshape(-1, logp.shape[-1]), 1, generator=gen).reshape(ids.shape)
    (-logp.gather(-1, y[..., None]).sum()).backward()
