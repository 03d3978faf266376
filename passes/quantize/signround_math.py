"""Learned rounding for the E2M1 block formats: the differentiable quantizer SignRound tunes.

SignRound (Cheng et al., "Optimize Weight Rounding via Signed Gradient Descent", the algorithm
of Intel's auto-round) gives every weight a rounding offset V in [-0.5, 0.5] and every scale
block a factor alpha, and tunes them so the *block's output* on the calibration activations
matches the original block's (passes/quantize/signround.py runs that loop). This module is the
quantizer they parametrise, one Linear W [N, K] at a time:

    y = W / m            m [N, K]: each element's dequant multiplier (its block's scale)
    q = grid(y + V * step(y))     step: the E2M1 grid spacing at |y| (0.5 below 2, 1 below 4, else 2)
    Wq = q * m

so V = +-0.5 moves an element by half a grid step (up to the next code), as SignRound's
V moves an integer code by half a step. `grid` is round-to-nearest-even on E2M1 (saturating
at 6), with a straight-through gradient. The block scale is alpha times RTN's:
- NVFP4: s = E4M3(amax_block / 6 * g * alpha) under the group's global multiplier g (the same
  g RTN gives the fused q/k/v or gate/up, or four over six's: its per-block 6-or-4 choice is
  kept, as alpha's starting point); m = s / g.
- MXFP4: m = 2^e, e the recipe's shared-exponent rule on amax_block * alpha.
The scale's rounding (E4M3 cast, power of two) is straight-through too. With V = 0 and
alpha = 1 `finish` returns RTN's (or four over six's) QTensor exactly.
`finish` encodes what the forward computed: dequantize(finish()) == fake() bit for bit.
"""

from __future__ import annotations

import torch

from tfcompile.kernels import formats as F

ALPHA_RANGE = (0.5, 1.5)  # alpha's clamp: clip the block max to half, or widen the scale by half


def _ste(x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """`rounded` forward, identity gradient (straight-through estimator)."""
    return x + (rounded - x).detach()


class _OffsetRound(torch.autograd.Function):
    """grid(y + V * step) * m with the straight-through gradient to V (dWq/dV = step * m), in one
    autograd node: the same values as `_ste` (whose y2 + (grid(y2) - y2) is exact: Sterbenz), with
    a third of the elementwise passes over [N, K] per step (profiled on SmolLM2's blocks)."""

    @staticmethod
    def forward(ctx, v, m, y, step):
        ctx.save_for_backward(m, step)
        return F.round_e2m1(y + v * step) * m

    @staticmethod
    def backward(ctx, grad):
        m, step = ctx.saved_tensors
        return grad * m * step, None, None, None


class LearnedRounding:
    """One Linear's rounding offsets and block-scale factors (the tuned parameters) and its
    differentiable quantized weight. `init` is RTN's QTensor (or four over six's) of w."""

    def __init__(self, w: torch.Tensor, init: F.QTensor, rule: str, device, scales: bool = True):
        self.wq = F.quantizer_of(init)
        self.nv = self.wq.shares_global_scale  # NVFP4's E4M3 block scales under a global multiplier
        self.block, self.rule, self.init = self.wq.block[0], rule, init
        n, k = w.shape
        # copies: the layer loop runs in inference mode, whose tensors autograd cannot save
        self.w = w.to(device=device, dtype=torch.float32, copy=True)
        self.amax = self.w.reshape(n, k // self.block, self.block).abs().amax(-1)  # [N, K/blk]
        self.g = init.global_scale.to(device=device, dtype=torch.float32, copy=True).reshape(()) if self.nv else None
        # the starting scale as a continuous value; alpha multiplies it (four over six's choice kept)
        s0 = init.scale.to(device=device, dtype=torch.float32, copy=True)
        self.base = self.amax / F.E2M1_MAX * self.g if self.nv else self.amax
        self.start = torch.where(self.base > 0, s0 / self.base.clamp(min=1e-30), 1.0) if self.nv else None
        self.v = torch.zeros(n, k, device=device, requires_grad=True)  # rounding offsets
        self.alpha = torch.ones(n, k // self.block, device=device, requires_grad=scales)  # scale factors
        # offsets only (alpha fixed at 1): the multiplier m, y = W / m and y's grid step do not change
        # between steps, so they are computed once and each step's quantizer is one fused function
        self._fixed = None if scales else self._grid()

    def _grid(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(m [N, K] each element's multiplier, y = W / m, step(y)) at the current alpha."""
        _, m = self._scales()
        m = m.repeat_interleave(self.block, 1)
        y = self.w / m
        step = F.e2m1_step(y.detach())
        if self.alpha.requires_grad:
            return m, y, step
        return m.detach(), y.detach(), step

    def params(self) -> list[torch.Tensor]:
        return [self.v, self.alpha] if self.alpha.requires_grad else [self.v]

    def clamp_(self) -> None:
        with torch.no_grad():
            self.v.clamp_(-0.5, 0.5)
            self.alpha.clamp_(*ALPHA_RANGE)

    def _scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(stored scale tensor [N, K/blk] (E4M3 or E8M0 codes), multiplier [N, K/blk] with a
        straight-through gradient to alpha)."""
        if self.nv:
            # alpha = 1: start * base is the starting E4M3 scale (up to an ulp), which the cast restores
            cont = self.base * self.start * self.alpha
            s = F.cast_e4m3(cont.detach())
            s = torch.where(s.float() == 0, torch.ones_like(s.float()).to(s.dtype), s)  # a zero block -> 1.0
            m = _ste(cont / self.g, s.float() / self.g)
            return s, m
        cont = self.amax * self.alpha  # what the shared exponent is taken from
        e = F.mx_shared_exponent(cont.detach(), "fp4", self.rule)
        m_q = torch.ldexp(torch.ones_like(cont), e)
        # a continuous stand-in proportional to the scale (gradient direction only: SignSGD)
        return F.encode_e8m0(e), _ste(cont / F.E2M1_MAX, m_q)

    def fake(self) -> torch.Tensor:
        """The quantized weight [N, K] float32, differentiable in V and alpha."""
        if self._fixed is not None:
            return _OffsetRound.apply(self.v, *self._fixed)
        m, y, step = self._grid()
        y2 = y + self.v * step
        q = _ste(y2, F.round_e2m1(y2.detach()))
        return q * m

    @torch.no_grad()
    def finish(self) -> F.QTensor:
        """The QTensor of the tuned weight: the codes and scales `fake` computed (CPU tensors)."""
        s, m = self._scales()
        m = m.repeat_interleave(self.block, 1)
        y = self.w / m
        codes = F.round_e2m1(y + self.v * F.e2m1_step(y))
        data = self.wq.encode(codes.cpu())
        return F.QTensor(self.init.format, data, s.cpu(), self.init.global_scale, self.init.shape,
                         self.init.granularity, self.init.rule, self.init.block)
