"""Activation observers: from the tensors a module sees, one amax for its static scale.

An observer is fed every calibration batch of one module's input (`update`)
and answers the amax the static scale is derived from (`amax`): FP8
input_scale = amax / 448, NVFP4 input_global_scale = 448 * 6 / amax.

- `max`: the largest |x| seen (no clipping; what every peer calls "max").
- `percentile`: the p-th percentile of |x| over every element the module saw
  (default p = 99.99), read off a histogram.
- `mse`: the clipping amax c = r * max, r searched over `ratios` values in
  [min_ratio, 1], that minimises the expected squared quantization error of
  |x| for the target format (`model`: its activation quantizer's `clip`, the error model
  kernels/formats/clip_error.py holds: per-tensor E4M3, or E2M1 blocks with E4M3 block scales).

Memory is bounded whatever the number of tokens: `AbsHistogram` keeps 2048
equal bins over [0, hi) and, when a batch's max exceeds hi, grows hi by a
power of two and merges each run of 2^k old bins into one, which is exact
(no re-interpolation), unlike re-spreading counts over new edges. TensorRT's /
modelopt's histogram calibrators instead fix the bin *width* at the first
batch and append bins, so their size grows with the range. The mse observer
of a block model keeps a seeded sample of at most 4096 blocks instead (16
elements: 256 KiB).

What `amax()` returns: None when the module saw nothing; 0.0 when every
element it saw was 0 (as `max` does; `Recorders` then gives the module the
fallback scale); otherwise a positive finite float. Non-finite elements
(NaN/Inf) are left out of the percentile and mse observers' statistics (a block
model: the blocks holding them).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from tfcompile.kernels.formats.clip_error import ClipModel, TensorE4M3Clip

OBSERVERS: dict[str, Callable[..., "Observer"]] = {}


def register_observer(name: str):
    def deco(cls):
        OBSERVERS[name] = cls
        return cls

    return deco


class Observer:
    """Base: `update(x)` per batch, `amax()` at the end (None when nothing was seen)."""

    def update(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    def amax(self) -> float | None:
        raise NotImplementedError


@register_observer("max")
class MaxObserver(Observer):
    def __init__(self) -> None:
        self._m: float | None = None

    def update(self, x: torch.Tensor) -> None:
        if x.numel():
            # max |x| as max(max x, -min x): one pass and no |x| temporary (x.abs().amax() took 19 ms
            # on a [4, 512, 8192] bf16 down_proj input on a Xeon, torch.aminmax 1.7 ms); NaN propagates
            lo, hi = torch.aminmax(x.detach())
            v = float(torch.maximum(hi.float(), lo.float().neg()))
            self._m = v if self._m is None else max(self._m, v)

    def amax(self) -> float | None:
        return self._m


class AbsHistogram:
    """Counts of non-negative values in `bins` equal bins over [0, hi), plus exact zeros.

    Bin i holds [i*w, (i+1)*w), w = hi / bins (the last bin also holds hi),
    as torch.histc bins it in float32 (a value within float32 rounding of an
    edge may land in the neighbour bin). hi is the first non-zero batch's max,
    then doubles as often as needed when a larger value arrives (old bins
    merge exactly). Exact zeros are counted apart (`zeros`), so the bins hold
    only positive values.
    """

    def __init__(self, bins: int = 2048):
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"bins must be a power of two >= 2, got {bins}")
        self.bins = bins
        self.hi: float | None = None  # upper edge of the last bin (None: no positive value yet)
        self.counts = torch.zeros(bins, dtype=torch.int64)
        self.zeros = 0
        self.max = 0.0  # exact largest value added

    @property
    def total(self) -> int:
        return self.zeros + int(self.counts.sum())

    @property
    def width(self) -> float:
        return (self.hi or 0.0) / self.bins

    def add(self, a: torch.Tensor) -> None:
        """a: float32 [n], finite, >= 0."""
        m = float(a.max()) if a.numel() else 0.0
        if m == 0.0:
            self.zeros += a.numel()
            return
        if self.hi is None:
            self.hi = m
        elif m > self.hi:
            self._grow(m)
        self.max = max(self.max, m)
        for part in a.split(1 << 24):  # histc counts in float32: exact below 2^24 per call
            zeros = part.numel() - int(torch.count_nonzero(part))
            h = torch.histc(part, bins=self.bins, min=0.0, max=self.hi)  # one pass, fp32 edges
            h[0] -= zeros  # exact zeros are counted apart
            self.zeros += zeros
            self.counts += h.round().long()

    def _grow(self, m: float) -> None:
        """hi *= 2^k (smallest k with hi >= m); each run of 2^k bins becomes one."""
        k = max(1, math.ceil(math.log2(m / self.hi)))
        while self.hi * 2.0 ** k < m:  # float rounding of log2
            k += 1
        f = 2 ** k
        if f >= self.bins:  # every old bin falls inside new bin 0
            merged = self.counts.sum().reshape(1)
        else:
            merged = self.counts.reshape(self.bins // f, f).sum(1)
        self.counts = torch.cat([merged, torch.zeros(self.bins - merged.numel(), dtype=torch.int64)])
        self.hi *= f

    def order_stats(self, ranks: torch.Tensor) -> torch.Tensor:
        """Estimated values (float64) of the `ranks`-th smallest elements (0-indexed, float64).

        Each estimate lies in the bin that holds the true order statistic (so it
        is within one bin width of it): ranks spread evenly across the bin."""
        cum = torch.cumsum(self.counts, 0).double()
        r = ranks.double() - self.zeros  # rank among the positive values
        i = torch.searchsorted(cum, r, right=True).clamp_(max=self.bins - 1)
        before = torch.where(i > 0, cum[(i - 1).clamp(min=0)], torch.zeros_like(r))
        frac = (r - before + 0.5) / self.counts[i].double().clamp(min=1)
        v = ((i.double() + frac.clamp(0, 1)) * self.width).clamp(max=self.max)
        return torch.where(r < 0, torch.zeros_like(v), v)  # ranks among the exact zeros

    def points(self, sub: int, merge: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(values [P], weights [P]) float32: the histogram as a piecewise-uniform density.

        Bins are first merged `merge` at a time; each non-empty bin becomes `sub`
        points at the midpoints of `sub` equal slices of [lo, min(hi, max)],
        weight count / sub. The top bin is cut at the exact max, so no point
        lies above any value seen."""
        counts = self.counts.reshape(-1, merge).sum(1).double()
        w = self.width * merge
        nz = torch.nonzero(counts).flatten()
        lo = nz.double() * w
        top = torch.minimum(lo + w, torch.tensor(self.max, dtype=torch.float64))
        t = (torch.arange(sub, dtype=torch.float64) + 0.5) / sub
        vals = lo[:, None] + t[None, :] * (top - lo)[:, None]  # [nz, sub]
        wts = (counts[nz] / sub)[:, None].expand(-1, sub)
        return vals.flatten().float(), wts.flatten().float()


def _abs_finite(x: torch.Tensor) -> torch.Tensor:
    """|x| as float32 [n], non-finite elements dropped."""
    a = x.detach().reshape(-1).float().abs()
    if math.isfinite(float(a.max())):  # max propagates NaN: one reduction checks everything
        return a
    return a[torch.isfinite(a)]


@register_observer("percentile")
class PercentileObserver(Observer):
    """The p-th percentile of |x| (numpy's default 'linear' rule), within one bin width.

    When the percentile falls among exact zeros (more than p% of |x| are 0) it
    would be 0, which is no scale: the max is returned instead."""

    def __init__(self, p: float = 99.99, bins: int = 2048):
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {p}")
        self.p = float(p)
        self.hist = AbsHistogram(bins)

    def update(self, x: torch.Tensor) -> None:
        if x.numel():
            self.hist.add(_abs_finite(x))

    def amax(self) -> float | None:
        h = self.hist
        n = h.total
        if n == 0:
            return None
        if h.max == 0.0 or self.p == 100.0:
            return h.max
        pos = (n - 1) * self.p / 100.0  # numpy/torch.quantile: linear between order statistics
        lo = math.floor(pos)
        v = h.order_stats(torch.tensor([lo, min(lo + 1, n - 1)], dtype=torch.float64))
        q = float(v[0] + (pos - lo) * (v[1] - v[0]))
        return q if q > 0 else h.max


@register_observer("mse")
class MSEObserver(Observer):
    """amax = r * max minimising the modelled squared quantization error of `model`
    (the format's `ActQuantizer.clip`: kernels/formats/clip_error.py).

    A value model (`model.block` 0; FP8, static per-tensor E4M3, scale c/448):
    the |x| histogram, read as a piecewise-uniform density (8 points per
    non-empty bin), is quantized as the kernel does.
    A block model (`model.block` b; NVFP4: the static part is the global scale
    g = 2688/c, the per-16 block scales are dynamic): a priority sample
    (`_PrioritySample`) of at most `sample_blocks` b-element blocks, drawn with
    probability growing with the block's squared max, is quantized as the
    kernel does (NVFP4: block scale e4m3(a/6*g), saturating at 448 for blocks
    whose max a exceeds c; E2M1 elements, saturating at 6) and its error
    weighted to an unbiased estimate of the whole stream's. Blocks far above
    the rest are always kept, so rare outliers are counted exactly.

    Candidates are `ratios` values evenly spaced in [min_ratio, 1] x max. The
    answer is the *largest* candidate whose modelled error is within `tol`
    (relative, default 1%) of the minimum: on flat error curves (Gaussian-like
    data) the argmin is noise of the model (the NVFP4 sample's own error is
    ~1-2%), and clipping there buys nothing measurable. For these float
    formats clipping pays only when it lifts values out of E4M3's subnormal
    range or fits the grid better, so the result stays near the max on most
    data (docs/design.md).
    """

    def __init__(self, model: ClipModel = TensorE4M3Clip(), bins: int = 2048, ratios: int = 100,
                 min_ratio: float = 0.3, sample_blocks: int = 4096, seed: int = 0, tol: float = 0.01):
        if not isinstance(model, ClipModel):
            raise ValueError(f"mse observer: model must be a format's clip error model (its ActQuantizer.clip: "
                             f"kernels/formats/clip_error.py), got {model!r}")
        if not (0 < min_ratio <= 1 and ratios >= 1):
            raise ValueError("mse observer: need 0 < min_ratio <= 1 and ratios >= 1")
        if not tol >= 0:
            raise ValueError(f"mse observer: tol must be >= 0, got {tol}")
        self.model, self.tol = model, float(tol)
        self.ratios = torch.linspace(min_ratio, 1.0, ratios, dtype=torch.float64) if ratios > 1 \
            else torch.ones(1, dtype=torch.float64)
        self.hist = AbsHistogram(bins) if not model.block else None  # |x|
        self.blocks = _PrioritySample(sample_blocks, seed, model.block) if model.block else None
        self._seen, self._max = 0, 0.0
        self._best: float | None = None

    def update(self, x: torch.Tensor) -> None:
        if not x.numel():
            return
        self._best = None
        if not self.model.block:
            a = _abs_finite(x)
            self.hist.add(a)
            self._seen, self._max = self._seen + a.numel(), self.hist.max
            return
        blocks, amax_b = _blocks(x, self.model.block)  # [B, block] signed, x's dtype; [B] float32
        self.blocks.add(blocks, amax_b)
        self._seen += blocks.numel()
        self._max = max(self._max, float(amax_b.max())) if amax_b.numel() else self._max

    def errors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate amax [C] float64, modelled squared error [C] float64)."""
        cands = self.ratios * self._max
        if not self.model.block:
            v, w = self.hist.points(sub=8)
            return cands, self.model.sse(v, w, cands.float())
        rows, w = self.blocks.sample()
        return cands, self.model.sse(rows, w, cands.float())

    def amax(self) -> float | None:
        if self._seen == 0:
            return None
        if self._max == 0.0:
            return 0.0
        if self._best is None:
            cands, err = self.errors()
            best = torch.nonzero(err <= err.min() * (1 + self.tol)).flatten()[-1]  # largest within tol
            self._best = float(cands[best])
        return self._best


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (`block`-element blocks [B, block] in x's dtype (a view when K % block == 0),
    block max of |x| float32 [B]); K zero-padded to a multiple of `block`; blocks with
    non-finite elements dropped (amax propagates NaN and Inf)."""
    b = x.detach().reshape(-1, x.shape[-1])
    if b.shape[-1] % block:
        b = torch.nn.functional.pad(b, (0, -b.shape[-1] % block))
    b = b.reshape(-1, block)
    amax = b.abs().amax(1).float()
    ok = torch.isfinite(amax)
    return (b, amax) if bool(ok.all()) else (b[ok], amax[ok])


class _PrioritySample:
    """Priority sampling (Duffield, Lund & Thorup 2007) of at most `n` blocks.

    Block i has weight w_i = (its max)^2 (its quantization error grows with it)
    and priority w_i / u_i, u_i ~ U(0, 1] from a seeded generator; the n highest
    priorities are kept and tau is the highest priority ever dropped. Then
    sum over kept blocks of f_i * max(w_i, tau) / w_i is an unbiased estimate
    of sum f_i over *every* block, for any f (here: its squared error at a
    candidate scale). Blocks with w_i > tau count with weight 1, i.e. exactly.
    All-zero blocks (w = 0) are never kept: their error is 0 at any scale.
    Memory: n x block float32 plus O(n); it depends only on the seed and the order.
    """

    def __init__(self, n: int, seed: int, block: int = 16):
        self.n = n
        self.gen = torch.Generator().manual_seed(seed)
        self.rows = torch.zeros(0, block)
        self.pri = torch.zeros(0, dtype=torch.float64)
        self.tau = 0.0

    def add(self, rows: torch.Tensor, amax: torch.Tensor) -> None:
        """rows [B, block] blocks (any float dtype, signed), amax [B] their max |x|. Only the
        batch's n + 1 best candidates are gathered (as float32 |x|), so the cost is O(B)
        plus O(n) rows."""
        pri = (amax.double() ** 2) / (1.0 - torch.rand(amax.shape[0], generator=self.gen,
                                                         dtype=torch.float64))  # u in (0, 1]
        live = torch.nonzero(pri > 0).flatten()  # all-zero blocks never enter
        pri = pri[live]
        if pri.numel() > self.n + 1:  # drop all but the batch's n + 1 highest first
            top, idx = torch.topk(pri, self.n + 2, sorted=True)
            self.tau = max(self.tau, float(top[-1]))
            pri, live = top[:-1], live[idx[:-1]]
        pri = torch.cat([self.pri, pri])
        rows = torch.cat([self.rows, rows[live].float().abs()])
        if pri.numel() > self.n:
            top, idx = torch.topk(pri, self.n + 1, sorted=True)
            self.tau = max(self.tau, float(top[-1]))
            pri, rows = top[:-1], rows[idx[:-1]]
        self.pri, self.rows = pri, rows

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(blocks [k, block] float32, estimate weights [k] float64, each >= 1)."""
        w = self.rows.amax(1).double() ** 2
        return self.rows, torch.clamp(w, min=self.tau) / w


def make_observer(kind: str, **params) -> Observer:
    """A fresh observer of kind `kind` (a key of OBSERVERS)."""
    try:
        cls = OBSERVERS[kind]
    except KeyError:
        raise ValueError(f"unknown observer {kind!r}; known: {', '.join(sorted(OBSERVERS))}") from None
    return cls(**params)
