"""`gptq` algorithm: GPTQ (Frantar et al., 2022) for the block formats and FP8.

For a Linear W [N, K] whose inputs X have Hessian H = X^T X / n [K, K],
columns are quantized one at a time and each one's rounding error is pushed
onto the columns not yet quantized, weighted by the inverse Hessian, so the
layer's *output* error ||X W^T - X Q^T|| shrinks rather than the weight error.
Adapted to block scales (the "static groups" variant): every block's scale
(and NVFP4's global scale) is fixed from the original weights *before* any
column is quantized — exactly the RTN scales — so the encoding is an
ordinary NVFP4/MXFP4/FP8 tensor and act-order can visit columns in any
order. Options: dampening (fraction of mean diag(H) added to the diagonal),
act-order (columns by decreasing diag(H)), column block size for the lazy
batch updates. With H = I no error is propagated and GPTQ equals RTN.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from tfcompile.kernels import formats as F
from tfcompile.ir import register_algorithm
from tfcompile.passes.quantize.rtn import quantize_weight, run_rtn

DAMP = 0.01
BLOCK = 128


def _inverse_hessian(h: torch.Tensor, w: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp*mean(diag) I)^-1; dead inputs pinned to 1."""
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += torch.eye(h.shape[0]) * damp * torch.diag(h).mean()
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def gptq_values(w: torch.Tensor, h: torch.Tensor, m: torch.Tensor, grid: F.WeightQuantizer, *,
                damp: float = DAMP, act_order: bool = True, block: int = BLOCK) -> torch.Tensor:
    """Quantized values (dequantized, float32 [N, K]) of w under fixed multipliers m, rounded
    on `grid`'s element grid (its `round_to_grid`)."""
    w = w.float().clone()
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(w.shape[1])
    inv = torch.argsort(perm)
    w, m, h = w[:, perm], m[:, perm], h[perm][:, perm]
    hinv = _inverse_hessian(h, w, damp)
    out = torch.zeros_like(w)
    k = w.shape[1]
    for c0 in range(0, k, block):
        c1 = min(c0 + block, k)
        wb, errs = w[:, c0:c1].clone(), torch.zeros(w.shape[0], c1 - c0)
        hb = hinv[c0:c1, c0:c1]
        for j in range(c1 - c0):
            col, mj = wb[:, j], m[:, c0 + j]
            q = grid.round_to_grid(col / mj) * mj
            out[:, c0 + j] = q
            e = (col - q) / hb[j, j]
            wb[:, j + 1:] -= e[:, None] * hb[j, j + 1:][None, :]
            errs[:, j] = e
        w[:, c1:] -= errs @ hinv[c0:c1, c1:]  # lazy batch update of the remaining columns
    return out[:, inv]


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, q_rtn: F.QTensor, **opts) -> F.QTensor:
    """Re-encode w by GPTQ under q_rtn's fixed scales; returns a QTensor of the same format."""
    wq = F.quantizer_of(q_rtn)
    m = wq.multipliers(q_rtn)  # each element's dequant multiplier under the fixed RTN scales
    vals = gptq_values(w, h, m, wq, **opts)  # exactly code * multiplier for every element
    elems = vals / m  # exact element values on the grid (division by the same multiplier)
    return dataclasses.replace(q_rtn, data=wq.encode(elems))


@register_algorithm("gptq")
def run_gptq(job, program, source):
    """GPTQ with the group's shared Hessian (q/k/v and gate/up share one input)."""
    h = program.hessians.get(job.group.key)
    if h is None:  # no calibration token reached it (or a fused expert): RTN, and say so
        out, stats = run_rtn(job, program, source)
        return out, [dict(x, algorithm="rtn (no Hessian)") for x in stats]

    solve: list[float] = []  # seconds per member, in member order

    def quantizer(w, prog, gscale, name, model_dtype):
        t0 = time.perf_counter()
        q = quantize_weight(w, prog, gscale, name, model_dtype)
        q = gptq_quantize(w, h, q, act_order=prog.gptq_act_order, damp=prog.gptq_damp)
        solve.append(time.perf_counter() - t0)
        return q

    out, stats = run_rtn(job, program, source, quantizer=quantizer)
    # "timing" is reported by pack and kept out of the manifest (it would break byte-identical reruns)
    return out, [dict(x, algorithm="gptq", timing={"solve_s": s}) for x, s in zip(stats, solve)]
