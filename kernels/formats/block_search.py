"""Block scales of E2M1 formats chosen by a per-block quadratic error (the output-scale search's
inner loop: passes/quantize/output_scales.py says what A is and why).

For each block of `blk` weights (16: NVFP4, E4M3 scale codes under a global multiplier g; 32:
MXFP4, E8M0 exponents) every candidate scale is tried, base code + each of `offsets` (base: the
format's RTN code from the block maximum, or `fixed` codes given), and the one whose rounding
leaves the least d A_b d^T (d = rounded - x, A_b the block's [blk, blk] matrix) is kept. The exact
arithmetic, which the C kernel (`_csrc_search`) repeats bit for bit on every ISA:

    s = e4m3_value(code) / g   |   2^e            (NVFP4 code clamped to 1..126, MXFP4 e to -127..127)
    d_i = round_e2m1(x_i / s) * s - x_i
    err = sum_i d_i * (A_ii d_i + sum_{j>i} A_ij d_j)   (`tri`: A_ij = H_ij + H_ji packed row by row)
    candidates in order, the first kept on ties; codes = encode_e2m1(x / s_best)
    row error = the row's block errors added in block order in float64.

`_reference` is that in plain torch (also the fallback without a C compiler); tests/kernels/
test_block_search.py proves the kernel equal to it on every vector path this CPU runs.
"""

from __future__ import annotations

import torch

from . import fast
from .checks import check_finite
from .elements import E2M1_MAX, cast_e4m3, encode_e2m1, round_e2m1
from .impl import use_fast
from .mx import mx_shared_exponent
from .packing import pack_fp4

ROWS = 256  # rows per chunk of the reference: temporaries ~ ROWS x K x 4 bytes per candidate


def tri(hb: torch.Tensor) -> torch.Tensor:
    """Diagonal blocks H_bb [B, blk, blk] -> A [B, blk (blk + 1) / 2] float32: per block, row by row,
    A_ii = H_ii then A_ij = H_ij + H_ji for j > i (the quadratic form's upper triangle)."""
    blk = hb.shape[-1]
    h = hb.float()
    sym = h + h.transpose(1, 2)
    i, j = torch.triu_indices(blk, blk)
    return torch.where(i == j, h[:, i, j], sym[:, i, j]).contiguous()


def _tri_err(d: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """d [R, B, blk], a [B, T] -> err [R, B]: the docstring's sum, in its order."""
    blk = d.shape[-1]
    err, t = torch.zeros(d.shape[:2]), 0
    for i in range(blk):
        p = a[:, t] * d[..., i]
        t += 1
        for j in range(i + 1, blk):
            p = p + a[:, t] * d[..., j]
            t += 1
        err = err + d[..., i] * p
    return err


def _candidate_scales(base: torch.Tensor, off: int, mx: bool, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """base codes [R, B] (int32) + off -> (stored code [R, B] int32, multiplier s [R, B] float32)."""
    if mx:
        e = (base + off).clamp(-127, 127)
        return e, torch.ldexp(torch.ones_like(e, dtype=torch.float32), e)
    c = (base + off).clamp(1, 126)
    return c, c.to(torch.uint8).view(torch.float8_e4m3fn).float() / g


def _reference(x: torch.Tensor, a: torch.Tensor, blk: int, g: torch.Tensor | None, rule: str | None,
               offsets: tuple[int, ...], fixed: torch.Tensor | None, name: str | None):
    n, k = x.shape
    mx = g is None
    packed, scales, row_err = [], [], []
    for r0 in range(0, n, ROWS):
        xb = x[r0: r0 + ROWS].float().reshape(-1, k // blk, blk)
        amax = xb.abs().amax(-1)
        check_finite(amax, name)
        if fixed is not None:
            base = fixed[r0: r0 + ROWS].to(torch.int32) - (127 if mx else 0)
        elif mx:
            base = mx_shared_exponent(amax, "fp4", rule)
        else:
            base = cast_e4m3(amax / E2M1_MAX * g).view(torch.uint8).to(torch.int32)
        best = None
        for off in offsets:
            c, s = _candidate_scales(base, off, mx, g)
            err = _tri_err(round_e2m1(xb / s[..., None]) * s[..., None] - xb, a)
            if best is None:
                best = [err, s, c]
                continue
            better = err < best[0]
            best = [torch.where(better, new, old) for new, old in zip((err, s, c), best)]
        err, s, c = best
        packed.append(pack_fp4(encode_e2m1(xb / s[..., None]).reshape(-1, k)))
        scales.append((c + (127 if mx else 0)).to(torch.uint8))
        acc = torch.zeros(xb.shape[0], dtype=torch.float64)
        for b in range(err.shape[1]):  # block order, as the kernel adds them
            acc = acc + err[:, b].double()
        row_err.append(acc)
    return torch.cat(packed), torch.cat(scales), torch.cat(row_err)


def search_blocks(x: torch.Tensor, a: torch.Tensor, *, g: torch.Tensor | None = None, rule: str | None = None,
                  offsets: tuple[int, ...] = (0,), fixed: torch.Tensor | None = None, name: str | None = None,
                  impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, K] weights; a = tri(H's diagonal blocks) [K / blk, T]; g (1,) NVFP4's global multiplier
    (blk 16) or None for MXFP4 (blk 32, `rule` picks the base exponent); fixed: stored scale codes
    [N, K / blk] (uint8) to start from instead of RTN's. Returns (packed E2M1 codes [N, K / 2] uint8,
    stored scale codes [N, K / blk] uint8: E4M3 bits or E8M0, each row's error [N] float64)."""
    blk = 16 if g is not None else 32
    if x.dim() != 2 or x.shape[1] % blk or a.shape != (x.shape[1] // blk, blk * (blk + 1) // 2):
        raise ValueError(f"search_blocks: x {tuple(x.shape)} and A {tuple(a.shape)} do not match blocks of {blk}")
    a = a.float().contiguous()
    gf = None if g is None else g.float().reshape(())
    if not use_fast(impl, x):
        return _reference(x, a, blk, gf, rule, tuple(offsets), fixed, name)
    return fast.fp4_search(x, a, blk, None if gf is None else float(gf), rule == "ceil", tuple(offsets),
                           None if fixed is None else fixed.to(torch.uint8).contiguous(), name)
