"""NVFP4 "four over six" (4/6) block scales: each block's max maps to 6 or to 4 on the E2M1 grid.

E2M1's grid is coarse at the top (4 -> 6 is one step of 2), so with the usual scale (block max
-> 6) values between 4 and 6 times the step lose up to 17% each. Mapping the block max to 4
instead uses the grid {0, 0.5, 1, 1.5, 2, 3, 4} for the block: finer near the max, coarser at
the bottom. Per block we quantize with both scales and keep the one with the smaller squared
error (ties keep 6). Cook et al., "Four Over Six" (arXiv:2512.02010); modelopt's
NVFP4_FOUR_OVER_SIX preset (an MSE calibration over amax multipliers 1.0 and 1.5 with
`four_over_six` block sizes) does the same.

The global scale must leave room for the larger block scales: with the block max mapped to 4,
a block scale is amax_block / 4 * g, which for the tensor's largest block and the usual
g = 448 * 6 / amax is 672, beyond E4M3's 448. Like modelopt we normalise to 256 instead:
g = 256 * 6 / amax, so every block scale stays <= 384. The stored tensors are ordinary NVFP4
(compressed-tensors weight_global_scale is just a different number), so every engine that
serves NVFP4 serves them; only the weights use 4/6 (activation block scales are computed by the
engine at run time, max -> 6).

Selected by `--set quantize.nvfp4_scales=four_over_six`; combines with every algorithm (RTN,
MSE: the search then runs under the 256 normalisation, GPTQ: its fixed scales are the 4/6 ones,
AWQ: the search scores 4/6 quantization).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcompile.kernels import formats as F
from tfcompile.kernels.formats.quantizer import NVFP4Weights, weight_quantizer
from tfcompile.passes.quantize.mse import nvfp4_mse

SCALE_MAX = 256.0  # E4M3 value the largest block scale maps to when the block max -> 6 (448 for "max")
TARGETS = (6.0, 4.0)


def global_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax -> the 4/6 multiplier 256 * 6 / amax (float32, (1,)); 1.0 for a zero tensor, like
    nvfp4_global_scale."""
    a = amax.float().reshape(-1).clamp(min=torch.finfo(torch.float32).tiny)
    g = torch.full_like(a, SCALE_MAX * F.E2M1_MAX) / a  # a true division (scalar / tensor multiplies by 1/a)
    return torch.where(torch.isfinite(g), g, torch.ones_like(g))


def quantize(w: torch.Tensor, g: torch.Tensor, name: str | None = None) -> F.QTensor:
    """NVFP4 QTensor of w [N, K] with 4/6 block scales under global multiplier g (1,)."""
    return nvfp4_mse(w, g, name, targets=TARGETS)


@dataclass(frozen=True)
class FourOverSixWeights(NVFP4Weights):
    """NVFP4 weights with 4/6 block scales (Program.nvfp4_weights): the group's global scale
    normalised to 256, each block's max mapped to 6 or 4. Stored and read like any NVFP4."""

    def group_global_scale(self, weights, names=()):
        names = list(names) or [None] * len(weights)
        amax = torch.cat([F.weight_amax(w, name=n) for w, n in zip(weights, names)]).amax()
        return global_scale(amax.reshape(1))

    def quantize(self, w, *, global_scale=None, rule="", scale_dtype=torch.float32, name=None, impl="auto"):
        return quantize(w, global_scale, name)


_NVFP4 = weight_quantizer("nvfp4")
WEIGHTS = FourOverSixWeights(_NVFP4.format, _NVFP4.granularity, _NVFP4.block, _NVFP4.packed, _NVFP4.element,
                             _NVFP4.k_multiple)
