"""KL per decoder layer, through the logit lens (`tfcompile eval --layer-kl`).

After each decoder layer i, both models' hidden states h_i [B, L, H] go through their own
final norm and lm_head, as if the model stopped there, and we measure

    KL_i = mean over the lens's positions of KL(softmax(head(norm(h_i_ref))) || softmax(head(norm(h_i_model))))

in nats. The lens's positions are `n` positions spread evenly over the whole evaluation (batch
order, position k of n at global index floor((k + 1/2) * total / n): every row and document of
the text is sampled, none twice, the same ones in one process and under torchrun); all of them
when the evaluation has no more than n. After the last layer the models apply exactly that norm
and head, so its figure is taken from the logits the evaluation already computed (LogitMetrics,
on the same positions): the model's own KL(ref || model), with no lm_head work of its own, and
equal to the eval table's `kl_mean` when the lens covers every position.

Cost: two head projections (V x H multiply-adds each) per earlier layer and lens position, in
float32 chunks of at most CHUNK_ELEMENTS logits, so a large vocabulary does not allocate
[positions, V] tensors per layer. `lens_positions` sizes n so that this work stays within
LENS_WORK_SHARE of a plain eval's matmul work (issue 31: all per-layer figures within 1.5x of a
plain eval), between LENS_MIN_POSITIONS and LENS_MAX_POSITIONS: on SmolLM2 (V 49,152 x H 576,
the head ~7x a decoder layer's Linears) 512 positions of a 4,096-token eval were 0.76x.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.evaluate.kvtext import LENS_MAX_POSITIONS, LENS_MIN_POSITIONS, LENS_WORK_SHARE

CHUNK_ELEMENTS = 1 << 23  # logits per model per chunk: 32 MiB of float32


def decoder_parts(model: nn.Module) -> tuple[nn.ModuleList, nn.Module, nn.Module] | None:
    """(decoder layers, final norm, lm_head) of a transformers causal LM, or None when the
    architecture does not expose them as `<base>.layers` / `<base>.norm` (e.g. encoders)."""
    base = getattr(model, "model", None)
    layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(layers, nn.ModuleList) or norm is None or head is None:
        return None
    return layers, norm, head


def lens_positions(total: int, plain_per_token: int, lens_per_position: int) -> int:
    """How many of `total` evaluation positions the lens covers: all when total is at most
    LENS_MIN_POSITIONS; else as many as keep its work (`lens_per_position` multiply-adds each)
    within LENS_WORK_SHARE of a plain eval's (`plain_per_token` per position), clamped to
    [LENS_MIN_POSITIONS, LENS_MAX_POSITIONS]."""
    if total <= LENS_MIN_POSITIONS:
        return total
    budget = int(LENS_WORK_SHARE * plain_per_token * total) // max(1, lens_per_position)
    return min(total, LENS_MAX_POSITIONS, max(LENS_MIN_POSITIONS, budget))


def spread(total: int, n: int) -> torch.Tensor:
    """n distinct global positions spread evenly over range(total): k -> floor((2k + 1) total / 2n)."""
    k = torch.arange(n, dtype=torch.int64)
    return (2 * k + 1) * total // (2 * n)


def matmul_work(reference: nn.Module) -> tuple[int, int]:
    """(a plain eval's multiply-adds per position: both models' Linears and lm_heads, counted as
    twice the reference's; the lens's per position: two lm_head projections per decoder layer but
    the last)."""
    layers, _, head = decoder_parts(reference)
    linear = sum(m.weight.numel() for m in reference.modules() if isinstance(m, nn.Linear))
    return 2 * linear, 2 * (len(layers) - 1) * head.weight.numel()


@dataclass
class LayerKL:
    max_positions: int | None = None  # None: lens_positions() decides (tests pin it)
    kl: list[float] = field(default_factory=list)  # sum over the lens's positions, per layer
    positions: int = 0  # how many positions the lens covers (set by attach)
    _picks: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))  # global
    _local: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))  # this batch's
    _cand: dict[int, torch.Tensor] = field(default_factory=dict)
    _hooks: list = field(default_factory=list)
    _parts: tuple = ()

    def attach(self, candidate: nn.Module, reference: nn.Module, total: int) -> bool:
        """Hook both models' decoder layers for an evaluation of `total` positions; False
        (nothing attached) if either has none."""
        cand, ref = decoder_parts(candidate), decoder_parts(reference)
        if cand is None or ref is None or len(cand[0]) != len(ref[0]):
            return False
        self._parts = (cand, ref)
        self.kl = [0.0] * len(ref[0])
        n = min(total, self.max_positions) if self.max_positions is not None else \
            lens_positions(total, *matmul_work(reference))
        self._picks, self.positions = spread(total, n), n
        for i, (lc, lr) in enumerate(zip(cand[0][:-1], ref[0][:-1])):  # the last: batch_done
            self._hooks.append(lc.register_forward_hook(self._keep(i)))
            self._hooks.append(lr.register_forward_hook(self._compare(i)))
        return True

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def begin(self, offset: int, count: int) -> torch.Tensor:
        """The next batch holds global positions [offset, offset + count) (under torchrun a rank
        runs every N-th batch); returns the lens's positions in it, row-major indices into the
        batch's [B * L] positions (LogitMetrics.update's `picks`, the last layer's term)."""
        p = self._picks
        self._local = p[(p >= offset) & (p < offset + count)] - offset
        return self._local

    def batch_done(self, last_kl: float) -> None:
        """`last_kl`: the sum of the models' own KL(ref || model) over this batch's lens positions
        (LogitMetrics.update(..., picks=begin(...)).picked_kl), the last layer's term."""
        if self.kl:
            self.kl[-1] += last_kl

    def take(self) -> list[float]:
        """The last batch's per-layer sums (zeroed here): what the other ranks replay."""
        out, self.kl = self.kl, [0.0] * len(self.kl)
        return out

    def replay(self, parts: list[list[float]]) -> None:
        """Every batch's `take()` in batch order, added as one process adds them (bit for bit)."""
        self.kl = [0.0] * len(self.kl)
        for part in parts:
            for i, v in enumerate(part):
                self.kl[i] += v

    def _keep(self, i: int):
        def hook(_mod, _args, out):
            self._cand[i] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return hook

    def _compare(self, i: int):
        def hook(_mod, _args, out):
            hc = self._cand.pop(i, None)
            hr = out[0] if isinstance(out, (tuple, list)) else out
            if hc is None or self._local.numel() == 0:
                return
            self.kl[i] += self._kl(self._rows(hc), self._rows(hr.detach()))
        return hook

    def _rows(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, L, H] -> its lens positions [n, H] (the whole batch as is, no copy, when it has no other)."""
        h = h.reshape(-1, h.shape[-1])
        if self._local.numel() == h.shape[0]:
            return h
        return h.index_select(0, self._local.to(h.device))

    def _kl(self, hc: torch.Tensor, hr: torch.Tensor) -> float:
        """Sum over the rows of hc, hr [n, H] of KL(ref || model) through norm and head, in
        chunks of rows so each chunk's logits [rows, V] stay within CHUNK_ELEMENTS."""
        (_, norm_c, head_c), (_, norm_r, head_r) = self._parts
        rows = max(1, CHUNK_ELEMENTS // int(head_r.weight.shape[0]))
        total = 0.0
        for s in range(0, hc.shape[0], rows):
            lp = F.log_softmax(head_c(norm_c(hc[s:s + rows])).float(), -1)
            lpr = F.log_softmax(head_r(norm_r(hr[s:s + rows])).float(), -1)
            total += float((lpr.exp() * (lpr - lp)).sum(-1).clamp_min(0).double().sum())
        return total

    def result(self) -> list[dict]:
        """[{layer, kl_mean}] per decoder layer (nats/token over `positions` positions)."""
        if not self.positions:
            return []
        return [{"layer": i, "kl_mean": round(k / self.positions, 8)} for i, k in enumerate(self.kl)]
