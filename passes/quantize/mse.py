"""`mse` algorithm: per-block scale search for the 4-bit block formats.

Round-to-nearest takes each block's scale from its max: the largest element
lands exactly on the top code (6 for E2M1) and everything else is rounded on
the grid that leaves. A slightly different scale can lower the block's
squared error: mapping the max a little above 6 clips it but refines the
rest; mapping it below 6 uses the grid's denser low end. For every block we
try a few candidate scales, always including the RTN one, and keep the one
with the least squared error — so no block gets worse than RTN.

- NVFP4: block scale = E4M3(amax_block / c * g) for c in NVFP4_TARGETS (6 = RTN).
- MXFP4: shared exponents e_rtn + d for d in MXFP4_SHIFTS (0 = the configured rule).
Other schemes fall back to RTN (FP8 and MXFP8 have 3-bit mantissas; a scale
search there changes little and is not offered).
Plain torch, [blocks, block] at a time; numbers, not speed, are the point.
"""

from __future__ import annotations

import torch

from tfcompile.kernels import formats as F
from tfcompile.ir import register_algorithm
from tfcompile.passes.quantize.rtn import run_rtn

NVFP4_TARGETS = (6.0, 6.5, 7.0, 5.5, 5.0, 4.5, 4.0)  # where the block max maps on the E2M1 grid
MXFP4_SHIFTS = (0, 1, -1)  # shared-exponent offsets from the RTN rule's exponent
ROWS = 256  # rows per chunk: bounds the temporaries to ~ROWS x K x candidates floats


def _pick(x: torch.Tensor, cands: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, B, blk] float32; cands: dequant multipliers [R, B] each.
    Returns (index of the best candidate [R, B], its codes [R, B, blk])."""
    best_err, best_i, best_codes = None, None, None
    for i, s in enumerate(cands):
        codes = F.encode_e2m1(x / s[..., None])
        err = (F.decode_e2m1(codes) * s[..., None] - x).pow(2).sum(-1)
        if best_err is None:
            best_err, best_i, best_codes = err, torch.zeros_like(err, dtype=torch.long), codes
            continue
        better = err < best_err  # strict: ties keep the earlier (RTN-first) candidate
        best_err = torch.where(better, err, best_err)
        best_i = torch.where(better, torch.full_like(best_i, i), best_i)
        best_codes = torch.where(better[..., None], codes, best_codes)
    return best_i, best_codes


def nvfp4_mse(w: torch.Tensor, g: torch.Tensor, name: str | None = None,
              targets: tuple[float, ...] = NVFP4_TARGETS) -> F.QTensor:
    """NVFP4 with per-block scale search over `targets` (where the block max maps; the first
    wins ties); g = global multiplier (1,) (compressed-tensors)."""
    n, k = w.shape
    F.weight_amax(w, name=name)  # NaN/Inf -> FormatError naming the tensor
    packed, scales = [], []
    gf = g.float().reshape(())
    for r0 in range(0, n, ROWS):
        x = w[r0: r0 + ROWS].float().reshape(-1, k // 16, 16)
        amax = x.abs().amax(-1)
        cand_s = []
        for c in targets:
            s = F.cast_e4m3(amax / c * gf)
            s = torch.where(s.float() == 0, torch.ones_like(s.float()).to(s.dtype), s)  # never 0
            cand_s.append(s)
        idx, codes = _pick(x, [s.float() / gf for s in cand_s])
        stacked = torch.stack([s.view(torch.uint8) for s in cand_s])  # [C, R, B]
        chosen = stacked.gather(0, idx[None]).squeeze(0).view(torch.float8_e4m3fn)
        packed.append(F.pack_fp4(codes.reshape(x.shape[0], k)))
        scales.append(chosen)
    return F.QTensor("nvfp4", torch.cat(packed), torch.cat(scales), g.float().reshape(1),
                     (n, k), "group", None, (16,))


def mxfp4_mse(w: torch.Tensor, rule: str, name: str | None = None) -> F.QTensor:
    """MXFP4 with a per-block shared-exponent search around the `rule` exponent."""
    n, k = w.shape
    F.weight_amax(w, name=name)
    packed, scales = [], []
    for r0 in range(0, n, ROWS):
        x = w[r0: r0 + ROWS].float().reshape(-1, k // 32, 32)
        e0 = F.mx_shared_exponent(x.abs().amax(-1), "fp4", rule)
        exps = [(e0 + d).clamp(-127, 127) for d in MXFP4_SHIFTS]
        idx, codes = _pick(x, [torch.ldexp(torch.ones_like(e, dtype=torch.float32), e) for e in exps])
        e = torch.stack(exps).gather(0, idx[None]).squeeze(0)
        packed.append(F.pack_fp4(codes.reshape(x.shape[0], k)))
        scales.append(F.encode_e8m0(e))
    return F.QTensor("mxfp4", torch.cat(packed), torch.cat(scales), None, (n, k), "group", rule, (32,))


def search_of(wq: F.WeightQuantizer):
    """The block-scale search for a weight format, from what the format states (None: RTN's scales):
    E2M1 codes under per-block scales with a group global scale (NVFP4's E4M3 scales) or without
    one (MXFP4's E8M0 exponents). (w, program, group global scale, name) -> QTensor."""
    if wq.element != "e2m1" or not wq.block_scaled:
        return None
    if wq.shares_global_scale and wq.block == (16,):  # the searches' own block sizes
        return lambda w, program, gscale, name: nvfp4_mse(w, gscale, name)
    if not wq.shares_global_scale and wq.block == (32,):
        return lambda w, program, gscale, name: mxfp4_mse(w, program.mx_rule, name)
    return None


@register_algorithm("mse")
def run_mse(job, program, source):
    """Like RTN (same group global scales, outputs and stats), with searched block scales."""
    search = search_of(program.scheme.weights)
    if search is None:
        return run_rtn(job, program, source)
    return run_rtn(job, program, source,
                   quantizer=lambda w, prog, gscale, name, model_dtype: search(w, prog, gscale, name))
