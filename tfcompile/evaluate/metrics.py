"""Running metrics over batches: perplexity, KL(ref || model), top-1, per-layer SQNR.

All sums are float64 on float32 log-probabilities, so the result does not
depend on the batch size beyond float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.evaluate.kvtext import SQNR_MAX_POSITIONS


@dataclass
class LogitMetrics:
    nll: float = 0.0  # sum over predicted tokens, candidate
    nll_ref: float = 0.0  # same, reference
    targets: int = 0  # predicted tokens (each row: length - 1)
    kl: float = 0.0  # sum over positions of KL(ref || model), nats
    kl_max: float = 0.0
    agree: int = 0  # positions whose argmax matches
    positions: int = 0  # every position of every row

    picked_kl: float = 0.0  # the last update's KL sum over its `picks` positions (lens.py)

    def update(self, ids: torch.Tensor, logits: torch.Tensor, ref_logits: torch.Tensor,
               picks: torch.Tensor | None = None) -> list[tuple]:
        """ids [B, L]; logits [B, L, V] of the candidate and the reference. Returns each row's
        terms (`add` replays them: a data-parallel eval sums every row's in row order).
        picks: sorted row-major indices into the batch's B * L positions; also sum the
        per-position KL over them into `picked_kl`, the logit lens's last layer (lens.py)."""
        rows, self.picked_kl = [], 0.0
        start = 0  # this row's first row-major index
        for row, lm, lr in zip(ids, logits.float(), ref_logits.float()):  # one row at a time: V is large
            lp, lpr = F.log_softmax(lm, -1), F.log_softmax(lr, -1)
            kl = (lpr.exp() * (lpr - lp)).sum(-1).clamp_min(0)
            if picks is not None:
                self.picked_kl += _picked(kl, picks, start)
            start += kl.numel()
            tgt = row[1:]
            rows.append((float(kl.double().sum()), float(kl.max()), int((lm.argmax(-1) == lr.argmax(-1)).sum()),
                         row.numel(), float(lp[:-1].gather(-1, tgt[:, None]).double().sum()),
                         float(lpr[:-1].gather(-1, tgt[:, None]).double().sum()), tgt.numel()))
            self.add(rows[-1])
        return rows

    def add(self, terms: tuple) -> None:
        kl, kl_max, agree, positions, lp, lpr, targets = terms
        self.kl += kl
        self.kl_max = max(self.kl_max, kl_max)
        self.agree += agree
        self.positions += positions
        self.nll -= lp
        self.nll_ref -= lpr
        self.targets += targets

    def result(self) -> dict:
        ppl, ppl_ref = _exp(self.nll / self.targets), _exp(self.nll_ref / self.targets)
        return {"perplexity": ppl, "reference_perplexity": ppl_ref,
                "ppl_increase": ppl / ppl_ref - 1.0,
                "kl_mean": self.kl / self.positions, "kl_max": self.kl_max,
                "top1_agreement": self.agree / self.positions,
                "tokens": self.positions, "predicted_tokens": self.targets}


def _picked(kl: torch.Tensor, picks: torch.Tensor, start: int) -> float:
    """Sum of kl [L] (one row, row-major indices start .. start + L - 1) over those in `picks`."""
    sel = picks[(picks >= start) & (picks < start + kl.numel())] - start
    if sel.numel() == kl.numel():
        return float(kl.double().sum())  # the whole row, as a sum over kl[:L] gives it
    return float(kl[sel.to(kl.device)].double().sum()) if sel.numel() else 0.0


def _exp(x: float) -> float:
    return math.exp(x) if x < 709.0 else math.inf  # NaN stays NaN


def sqnr_db(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); None means infinite (no error at all)."""
    if noise == 0.0:
        return None
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


@dataclass
class _Acc:
    signal: float = 0.0  # sum y^2 over every position (end to end)
    noise_iso: float = 0.0
    noise_e2e: float = 0.0
    signal_iso: float = 0.0  # sum y^2 over the isolated SQNR's positions


@dataclass
class LayerSQNR:
    """Per quantized Linear, on the same tokens, with the reference's output y as signal:

    - isolated (`sqnr_db`): the reference Linear's input x fed to the
      candidate's Linear (its dequantized weight and activation emulation),
      so each figure is that layer's own error;
    - end to end (`e2e_sqnr_db`): the candidate's Linear output in the
      candidate model, whose input already carries every earlier layer's error.

    The isolated figure costs one more matmul per Linear, so it covers the first
    `MAX_POSITIONS` positions of the evaluation (batch order; `begin` gives each batch
    its global offset, so one process and N ranks cover the same positions); the end
    to end one, free, covers all.
    """

    acc: dict[str, _Acc] = field(default_factory=dict)
    MAX_POSITIONS: ClassVar[int] = SQNR_MAX_POSITIONS
    _rows: int | None = None  # this batch's first positions (row-major) the isolated SQNR takes
    _outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    _hooks: list = field(default_factory=list)
    _last: tuple | None = None  # (reference input x, act_key, its emulated quantization): see _quantized

    def attach(self, candidate_linears: dict, reference: nn.Module) -> None:
        ref_modules = dict(reference.named_modules())
        for name, ql in candidate_linears.items():
            ref = ref_modules.get(name)
            if not isinstance(ref, nn.Linear):
                continue
            self.acc[name] = _Acc()
            self._hooks.append(ql.module.register_forward_hook(self._keep(name)))
            self._hooks.append(ref.register_forward_hook(self._compare(name, ql)))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._last = None

    def _keep(self, name: str):
        def hook(_mod, _args, out):
            self._outputs[name] = out.detach()
        return hook

    def begin(self, offset: int, positions: int) -> None:
        """The next batch starts at global position `offset` and holds `positions` positions."""
        self._rows = max(0, min(positions, self.MAX_POSITIONS - offset))

    def _compare(self, name: str, ql):
        def hook(_mod, args, out):
            x, y = args[0], out.detach().float()
            a = self.acc[name]
            a.signal += _sq(y)
            n = y.numel() // y.shape[-1] if self._rows is None else self._rows
            if n:  # x [..., K] -> its first n positions [n, K], after the emulation of the whole x
                xq = self._quantized(x, ql)  # (a dynamic per-tensor activation scale sees all of x)
                xs, ys = xq.reshape(-1, xq.shape[-1])[:n], y.reshape(-1, y.shape[-1])[:n]
                y_iso = F.linear(xs, ql.module.weight, ql.module.bias).float()
                a.signal_iso += _sq(ys)
                a.noise_iso += _sq(ys - y_iso)
            y_e2e = self._outputs.pop(name, None)
            if y_e2e is not None:
                a.noise_e2e += _sq(y - y_e2e.float())
        return hook

    def _quantized(self, x: torch.Tensor, ql) -> torch.Tensor:
        """ql's activation emulation of the reference input x. The reference passes one tensor
        to the Linears that share an input (q/k/v, gate/up; they run one after another), so with
        the same quantizer (`act_key`) it is quantized once: the same function of the same
        tensor, bit for bit, at a third (attention) or half (MLP) of the emulation's cost."""
        if ql.act is None:
            return x
        last = self._last
        if last is not None and last[0] is x and ql.act_key is not None and last[1] == ql.act_key:
            return last[2]
        xq = ql.act(x)
        self._last = (x, ql.act_key, xq)
        return xq

    def take(self) -> dict[str, tuple[float, float, float, float]]:
        """This batch's terms per module, zeroed here (each Linear runs once per forward, so
        0.0 + term is the term; `add` replays them in batch order, bit for bit): (signal,
        isolated noise, end-to-end noise, isolated signal)."""
        out = {n: (a.signal, a.noise_iso, a.noise_e2e, a.signal_iso) for n, a in self.acc.items()}
        self.acc = {n: _Acc() for n in self.acc}
        return out

    def add(self, terms: dict[str, tuple[float, float, float, float]]) -> None:
        for name, (sig, iso, e2e, sig_iso) in terms.items():
            a = self.acc[name]
            a.signal += sig
            a.noise_iso += iso
            a.noise_e2e += e2e
            a.signal_iso += sig_iso

    def result(self) -> list[dict]:
        out = []
        for name, a in sorted(self.acc.items()):
            out.append({"module": name, "sqnr_db": _r(sqnr_db(a.signal_iso, a.noise_iso)),
                        "e2e_sqnr_db": _r(sqnr_db(a.signal, a.noise_e2e))})
        return out


def _sq(t: torch.Tensor) -> float:
    return float(t.square().sum(dtype=torch.float64))


def _r(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else round(v, 3)
