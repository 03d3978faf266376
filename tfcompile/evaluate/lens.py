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

Cost: two head projections (V x H multiply-adds each) per earlier layer and lens position. The
hooks keep only each layer's normed rows [n, H]; at the end of the batch every layer's rows go
through the head together, in float32 chunks of at most CHUNK_ELEMENTS logits (so a large
vocabulary never allocates [positions, V] per layer, and the head's weight is streamed once per
chunk of many rows rather than once per layer: small-M GEMMs ran at 2/3 of the speed). The KL of
a row is computed in place on its two logit rows, without log-softmax temporaries, as

    d = z_ref - z_model,  p = softmax(z_ref):  KL = E_p[d] + log E_p[exp(-d)]

(both terms small, so no large log-sum-exp cancels; tested against float64). `lens_positions`
sizes n so that this work stays within LENS_WORK_SHARE of a plain eval's matmul work (issue 31:
all per-layer figures within 1.5x of a plain eval), between LENS_MIN_POSITIONS and
LENS_MAX_POSITIONS: on SmolLM2 (V 49,152 x H 576, the head ~7x a decoder layer's Linears) 512
positions of a 4,096-token eval were 0.76x.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tfcompile.evaluate.kvtext import LENS_MAX_POSITIONS, LENS_MIN_POSITIONS, LENS_WORK_SHARE

CHUNK_ELEMENTS = 1 << 24  # logits per model per chunk: 64 MiB of float32 (341 rows of SmolLM2)


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
    _pending: list = field(default_factory=list)  # this batch's (layer, normed rows cand [n, H], ref [n, H])
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
        self._cand.clear()  # a batch cut short by an error leaves rows behind
        self._pending.clear()

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
        self._flush()
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
            (_, norm_c, _), (_, norm_r, _) = self._parts
            self._pending.append((i, norm_c(self._rows(hc)), norm_r(self._rows(hr.detach()))))
        return hook

    def _rows(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, L, H] -> its lens positions [n, H] (the whole batch as is, no copy, when it has no other)."""
        h = h.reshape(-1, h.shape[-1])
        if self._local.numel() == h.shape[0]:
            return h
        return h.index_select(0, self._local.to(h.device))

    def _flush(self) -> None:
        """Every pending layer's rows through both heads, in chunks of rows; each layer's KL sum
        added in row order (float64)."""
        if not self._pending:
            return
        layers = [i for i, nc, _ in self._pending for _ in range(nc.shape[0])]
        xc = torch.cat([nc for _, nc, _ in self._pending])
        xr = torch.cat([nr for _, _, nr in self._pending])
        self._pending.clear()
        (_, _, head_c), (_, _, head_r) = self._parts
        step = max(1, CHUNK_ELEMENTS // int(head_r.weight.shape[0]))
        kl = torch.cat([row_kl(_logits(head_r, xr[s:s + step]), _logits(head_c, xc[s:s + step]))
                        for s in range(0, xr.shape[0], step)])
        for i, k in zip(layers, kl.tolist()):
            self.kl[i] += k

    def result(self) -> list[dict]:
        """[{layer, kl_mean}] per decoder layer (nats/token over `positions` positions)."""
        if not self.positions:
            return []
        return [{"layer": i, "kl_mean": round(k / self.positions, 8)} for i, k in enumerate(self.kl)]


def _logits(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """head(x) [rows, V] as a float32 tensor this code owns (written in place by row_kl)."""
    z = head(x)
    return z if z.dtype == torch.float32 and z.is_contiguous() else z.float().contiguous()


def row_kl(zr: torch.Tensor, zc: torch.Tensor) -> torch.Tensor:
    """KL(softmax(zr) || softmax(zc)) per row of the logits zr, zc [rows, V] (float32, both
    overwritten), as float64 [rows], clamped at 0. With d = zr - zc and p = softmax(zr),

        KL = E_p[d] + log E_p[exp(-d)] = E_p[g(d)] + (log1p(y) - y),  g(d) = d + expm1(-d) >= 0,  y = E_p[expm1(-d)]

    so no log-softmax temporaries are written and no large log-sum-exps cancel: g is summed
    element by element (each term >= 0, of size d^2 / 2), and log1p(y) - y (of size y^2 / 2) is
    taken in float64. Against float64 log-softmaxes: 1e-6 relative at KL 5e-3, 1e-4 at 5e-7. In place
    but for one [rows, V] temporary: each elementwise pass over the logits costs about what a
    tenth of their matmul does."""
    nd = zc.sub_(zr)  # -d = zc - zr
    e = torch.expm1(nd)  # expm1(-d)
    g = torch.sub(e, nd, out=nd)  # g(d) = d + expm1(-d), in nd's place
    p = zr.sub_(zr.amax(-1, keepdim=True)).exp_()  # unnormalized softmax(zr), in (0, 1]
    z = p.sum(-1).double()  # float32 sums (torch's cascade): a float64 sum is 10x slower here
    y = e.mul_(p).sum(-1).double() / z
    g = g.mul_(p).sum(-1).double() / z
    return (g + (torch.log1p(y) - y)).clamp_min(0)
