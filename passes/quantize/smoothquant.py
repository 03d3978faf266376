"""`smoothquant` algorithm: SmoothQuant (Xiao et al., 2023), activation outliers migrated into the weights.

Same fold as AWQ (passes/quantize/awq.py: x W^T = (x / s)(W * s)^T, x / s folded into the norm
that feeds the group, verified on the real model by calibration/awq_stats.py), with
SmoothQuant's scale rule, which balances the *activation* range against the weight range
channel by channel so that both quantize well (the point for W4A4 and FP8 static activations):

    s_j = max|x_j|^alpha / max_i |W_ij|^(1 - alpha)      (max over every member's column j)

normalised like AWQ's by sqrt(max(s) min(s)) (a common factor is absorbed by the per-tensor and
per-block scales). alpha is searched over GRID by AWQ's loss, the output error of the group with
this scheme's weight *and* activation quantization on the recorded input rows; the first
candidate is s = 1 (reported as alpha 0), so no group ends above plain RTN on those rows.
Groups not fed by a norm (o_proj, down_proj) stay RTN, as with AWQ; the manifest says why.
"""

from __future__ import annotations

from functools import partial

import torch

from tfcompile.ir import register_algorithm
from tfcompile.passes.quantize.awq import HINT, S_RANGE, prepare_awq, run_awq, unsupported

GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # migration strength alpha (0.5: the paper's default)


def smooth_scales(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [K] float32 = x_max^alpha / w_max^(1 - alpha), clamped, normalised by sqrt(max * min)."""
    s = x_max.float().clamp_min(S_RANGE[0]).pow(alpha) / w_max.float().clamp_min(S_RANGE[0]).pow(1 - alpha)
    s = s.clamp(*S_RANGE)
    return s / (s.max() * s.min()).sqrt()


def smooth_candidates(st, weights: list[torch.Tensor]) -> list[tuple[float, torch.Tensor]]:
    """(0, ones) first (RTN), then SmoothQuant's rule for alpha in GRID."""
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    ones = torch.ones_like(st.max_abs, dtype=torch.float32)
    return [(0.0, ones)] + [(a, smooth_scales(st.max_abs, w_max, a)) for a in GRID]


register_algorithm("smoothquant", prepare=partial(prepare_awq, candidates=smooth_candidates),
                   supports=unsupported, hint=HINT, calibrate={"awq": True})(run_awq)
