"""Fused fast path: thin torch wrappers around the C kernels in `_csrc`.

Each function here computes exactly what the matching reference computes
(tests/kernels/test_fast.py checks bit-equality); it only avoids the
temporaries of eager torch. `available(x)` says whether a tensor can take
this path (CPU, contiguous, kernel library built).
"""

from __future__ import annotations

import math
import mmap

import torch

from . import _native
from .checks import raise_nonfinite

TILE = 16  # blocks per AVX-512 tile; thread slices are multiples of it


HUGE_MIN = 4 << 20  # outputs at least this large get transparent huge pages


def empty_u8(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized uint8 tensor; large ones in anonymous memory advised for huge pages.

    The kernels write every byte of a fresh output once. With 4 KiB pages that
    first touch costs ~1.5-2 us per page on this class of VM (a 58 MB FP8
    output: 12 ms to fill); with MADV_HUGEPAGE (THP in "madvise" mode, the
    common default) the same fill took 3 ms. The tensor keeps the mapping
    alive (torch.frombuffer holds a reference) and it is unmapped with it.
    """
    n = math.prod(shape)
    if n < HUGE_MIN or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=torch.uint8)
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # THP unavailable: ordinary pages, same result
    return torch.frombuffer(mm, dtype=torch.uint8, count=n).reshape(shape)


def available(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in _native.DTYPE_SUFFIX and _native.lib() is not None


def _c(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def amax_grid(x: torch.Tensor, bk: int, name: str | None) -> torch.Tensor:
    """x [..., K] -> float32 [rows, ceil(K/bk)] of max|x| per (row, column block)."""
    x = _c(x)
    k = x.shape[-1]
    rows = x.numel() // k
    nkb = -(-k // bk)
    out = torch.empty(rows, nkb, dtype=torch.float32)
    f, es = _native.fn("amax_grid", x.dtype), x.element_size()
    xp, op = x.data_ptr(), out.data_ptr()
    bad = _native.parallel(rows, lambda a, b: f(xp + a * k * es, b - a, k, bk, op + a * nkb * 4))
    if bad:
        raise_nonfinite(name)
    return out


def fp8_rows(x: torch.Tensor, scale_rows: torch.Tensor, bk: int, name: str | None) -> torch.Tensor:
    """data[r, k] = cast_e4m3(x[r, k] / scale_rows[r, k // bk]) for x viewed [rows, K].

    scale_rows: float32 [rows, ceil(K/bk)], or [1, ceil(K/bk)] shared by all rows."""
    x = _c(x)
    k = x.shape[-1]
    rows = x.numel() // k
    s = _c(scale_rows.float())
    srs = 0 if s.shape[0] == 1 else s.shape[1]  # row stride into the scale table
    out = empty_u8(tuple(x.shape))
    f, es = _native.fn("fp8_quant", x.dtype), x.element_size()
    xp, sp, op = x.data_ptr(), s.data_ptr(), out.data_ptr()
    bad = _native.parallel(
        rows, lambda a, b: f(xp + a * k * es, b - a, k, sp + a * srs * 4, srs, bk, op + a * k))
    if bad:
        raise_nonfinite(name)
    return out.view(torch.float8_e4m3fn)


def fp8_tiles(x: torch.Tensor, bn: int, bk: int, name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x viewed [rows, K] -> (e4m3 data [rows, K] in x's shape, float32 scales [ceil(rows/bn), ceil(K/bk)]).

    scale = max|x| / 448 over each bn x bk tile (0 -> 1.0), data = cast_e4m3(x / scale), in one
    pass over x (per-channel scaling: bn = 1, bk = K; 128 x 128 blocks: bn = bk = 128)."""
    x = _c(x)
    k = x.shape[-1]
    rows = x.numel() // k
    bands, nkb = -(-rows // bn), -(-k // bk)
    s = torch.empty(bands, nkb, dtype=torch.float32)
    out = empty_u8(tuple(x.shape))
    f, es = _native.fn("fp8_tiles", x.dtype), x.element_size()
    xp, sp, op = x.data_ptr(), s.data_ptr(), out.data_ptr()

    def call(a: int, b: int) -> int:  # bands [a, b)
        r0, r1 = a * bn, min(b * bn, rows)
        return f(xp + r0 * k * es, r1 - r0, k, bn, bk, sp + a * nkb * 4, op + r0 * k)

    if _native.parallel(bands, call, min_per_thread=max(1, 64 // bn)):  # a band of 128 rows is work enough
        raise_nonfinite(name)
    return out.view(torch.float8_e4m3fn), s


def nvfp4_blocks(x: torch.Tensor, g: float, name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] (K % 16 == 0), global multiplier g -> (packed [..., K/2], e4m3 [..., K/16])."""
    x = _c(x)
    nb = x.numel() // 16
    packed = empty_u8((*x.shape[:-1], x.shape[-1] // 2))
    scales = empty_u8((*x.shape[:-1], x.shape[-1] // 16))
    f, es = _native.fn("nvfp4_quant", x.dtype), x.element_size()
    xp, pp, sp = x.data_ptr(), packed.data_ptr(), scales.data_ptr()
    bad = _native.parallel(nb, lambda a, b: f(xp + a * 16 * es, b - a, g, pp + a * 8, sp + a), TILE)
    if bad:
        raise_nonfinite(name)
    return packed, scales.view(torch.float8_e4m3fn)


def mx_blocks(x: torch.Tensor, elem: int, ceil_rule: bool, name: str | None):
    """x [..., K] (K % 32 == 0) -> (data, E8M0 scales [..., K/32]).

    data: elem 4 -> packed uint8 [..., K/2]; elem 8 -> float8_e4m3fn [..., K]."""
    x = _c(x)
    nb = x.numel() // 32
    per = 16 if elem == 4 else 32  # output bytes per block
    data = empty_u8((*x.shape[:-1], x.shape[-1] * per // 32))
    scales = empty_u8((*x.shape[:-1], x.shape[-1] // 32))
    f, es = _native.fn("mx_quant", x.dtype), x.element_size()
    xp, dp, sp = x.data_ptr(), data.data_ptr(), scales.data_ptr()
    bad = _native.parallel(
        nb, lambda a, b: f(xp + a * 32 * es, b - a, elem, int(ceil_rule), dp + a * per, sp + a), TILE)
    if bad:
        raise_nonfinite(name)
    return (data if elem == 4 else data.view(torch.float8_e4m3fn)), scales


def fp4_search(x: torch.Tensor, a: torch.Tensor, blk: int, g: float | None, ceil_rule: bool,
               offsets: tuple[int, ...], fixed: torch.Tensor | None, name: str | None):
    """block_search.search_blocks on the C kernel: x [N, K], a [K / blk, T] float32 -> (packed [N, K / 2],
    scale codes [N, K / blk], row errors [N] float64); threads take slices of 16 rows (a whole number of
    vectors of every build: 16, 8 or 4 lanes)."""
    x = _c(x)
    n, k = x.shape
    nb = k // blk
    packed, scales = empty_u8((n, k // 2)), empty_u8((n, nb))
    row_err = torch.empty(n, dtype=torch.float64)
    offs = torch.tensor(offsets, dtype=torch.int32)
    f, es = _native.fn("fp4_search", x.dtype), x.element_size()
    xp, ap, pp, sp, ep, op = x.data_ptr(), a.data_ptr(), packed.data_ptr(), scales.data_ptr(), row_err.data_ptr(), offs.data_ptr()
    fp = 0 if fixed is None else fixed.data_ptr()

    def call(r0: int, r1: int) -> int:
        return f(xp + r0 * k * es, r1 - r0, k, blk, int(g is None), 0.0 if g is None else g, int(ceil_rule),
                 op, len(offsets), fp + r0 * nb if fp else None, ap, pp + r0 * (k // 2), sp + r0 * nb, ep + r0 * 8)

    if _native.parallel(n, call, grain=16, min_per_thread=4):
        raise_nonfinite(name)
    return packed, scales, row_err
