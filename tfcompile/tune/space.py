"""Config spaces per kernel, and pruning by the problem's shape and the target's limits.

A config is a dict of a kernel's knobs (KernelDef.knobs), e.g.
{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3,
"SPLIT_K": 1}. Knobs the kernel does not list keep its `default_config` value.

The kernel's `presets` (hand-picked configs, e.g. W4A16's "decode") are added
to the space, so the tuner never ranks without them.

Pruning, in order (each reason counted for the tuning table):
- shape: tiles larger than the problem (BLOCK_M above M rounded up to a power
  of two, BLOCK_N above N, BLOCK_K above K; but tiles of 128 are always kept);
  the MMA's M side (BLOCK_M, or
  BLOCK_N with SWAP_AB) at least 64, the smallest M of wgmma (m64nNk16) and of
  tcgen05.mma; SWAP_AB (tokens on the MMA's N side) and SPLIT_K > 1 only for
  M <= 64, where M gives too few rows or tiles, and split-K only where
  BLOCK_K * SPLIT_K divides K; FP4 GEMMs need BLOCK_K % 128 == 0 (operand
  alignment, docs/kernels.md "Hardware facts");
- smem: the kernel's `smem_bytes(config)` above the per-block maximum;
- registers: the fp32 accumulator tile (element-wise kernels: their BLOCK_M x
  BLOCK_K tile) per thread plus overhead above 255 -- beyond it ptxas spills,
  and takes minutes doing so;
- tmem (sm_100a): accumulator columns above the 512 of tensor memory.
What only the kernel knows (its `tl.static_assert`s) is checked afterwards by
running Triton's front end on the best-ranked configs (search.py).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

from tfcompile.tune.hardware import MODEL, TargetSpec
from tfcompile.tune.registry import mma_class
from tfcompile.tune.shapes import Problem

GEMM_VALUES = {
    "BLOCK_M": (16, 32, 64, 128, 256),  # 16, 32: only with SWAP_AB (the MMA's N side)
    "BLOCK_N": (32, 64, 128, 256),
    "BLOCK_K": (32, 64, 128, 256),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
    "SPLIT_K": (1, 2, 4, 8, 16),
    "GROUP_M": (8,),
    "SWAP_AB": (False, True),
}
MMA_MIN_M = 64  # wgmma m64nNk16; tcgen05.mma M = 64 or 128
# Tiles up to 128 stay in the space however small the problem: some kernels need 128 (a
# Blackwell scale atom spans 128 rows), and the cost model charges the padding anyway.
TILE_FLOOR = 128
ACT_VALUES = {"num_warps": (1, 2, 4, 8)}
# Act-quant kernels vary BLOCK_M (powers of two around their default) and num_warps only: their
# other tiles are tied to the format (e.g. BLOCK_K == 128 for 1x128 groups, swizzled scales).
ACT_VARIED = ("BLOCK_M", "num_warps")


def pow2ceil(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _values(kdef, knob: str) -> tuple:
    """Candidate values of one knob: the table above, or (act-quant BLOCK_M) powers of
    two around the kernel's default, or the default alone."""
    table = GEMM_VALUES if kdef.kind == "gemm" else ACT_VALUES
    if knob in table:
        return table[knob]
    default = kdef.default_config.get(knob)
    if kdef.kind != "gemm" and knob in ACT_VARIED and isinstance(default, int):
        return tuple(sorted({max(1, default << s) if s >= 0 else max(1, default >> -s) for s in range(-2, 3)}))
    return (default,) if default is not None else ()


def space(kdef) -> list[dict]:
    """Every combination of the kernel's knob values (before pruning), in a fixed order."""
    knobs = [k for k in kdef.knobs if _values(kdef, k)]
    base = {k: v for k, v in kdef.default_config.items() if k not in knobs}
    out = []
    for combo in itertools.product(*(_values(kdef, k) for k in knobs)):
        out.append({**base, **dict(zip(knobs, combo))})
    seen = {json.dumps(c, sort_keys=True) for c in out}
    for preset in (getattr(kdef, "presets", None) or {}).values():
        cfg = {**kdef.default_config, **preset}
        if json.dumps(cfg, sort_keys=True) not in seen:
            out.append(cfg)
    return out


def shape_ok(kdef, p: Problem, cfg: dict) -> bool:
    """Tiles no larger than the problem, tensor-core sized; split-K / swap-AB only for small M."""
    bm, bn, bk = cfg.get("BLOCK_M"), cfg.get("BLOCK_N"), cfg.get("BLOCK_K")
    if kdef.kind != "gemm":
        return bm is None or bm <= max(min(_values(kdef, "BLOCK_M") or (1,)), pow2ceil(p.m))
    swap = bool(cfg.get("SWAP_AB", False))
    if swap and p.m > 64:
        return False
    if bm is not None and bm > max(16 if swap else TILE_FLOOR, pow2ceil(p.m)):
        return False
    mma_m = bn if swap else bm
    if mma_m is not None and mma_m < MMA_MIN_M:
        return False
    if bn is not None and bn > max(TILE_FLOOR, pow2ceil(p.n)):
        return False
    if bk is not None and bk > max(32, pow2ceil(p.k)):
        return False
    split = cfg.get("SPLIT_K", 1)
    if split > 1 and (p.m > 64 or bk is None or p.k % (bk * split)):
        return False
    if mma_class(kdef, p.target) == "fp4" and bk is not None and bk % 128:
        return False
    return True


def _register_tile(kdef, cfg: dict) -> int:
    """fp32 values a block holds in registers: the GEMM accumulator BLOCK_M x BLOCK_N, or an
    element-wise kernel's BLOCK_M x BLOCK_K tile (0: unknown)."""
    if kdef.kind == "gemm":
        return cfg.get("BLOCK_M", 0) * cfg.get("BLOCK_N", 0)
    return cfg.get("BLOCK_M", 0) * cfg.get("BLOCK_K", 0)


@dataclass(frozen=True)
class Fit:
    ok: bool
    reason: str  # "" | "smem" | "registers" | "tmem" | "threads"
    ctas_per_sm: int  # resident blocks per SM (occupancy)
    smem: int  # bytes per block (the kernel's own figure)


def fit(kdef, cfg: dict, spec: TargetSpec) -> Fit:
    """Does one block fit the target, and how many fit on one SM?"""
    threads = 32 * int(cfg.get("num_warps", 4))
    smem = int(kdef.smem_bytes(cfg))
    if threads > 1024:
        return Fit(False, "threads", 0, smem)
    if smem > spec.smem_per_block:
        return Fit(False, "smem", 0, smem)
    limits = [spec.ctas_per_sm, spec.threads_per_sm // threads,
              spec.smem_per_sm // (smem + spec.smem_reserved_per_block)]
    tile = _register_tile(kdef, cfg)
    if tile:
        # GEMMs: Triton keeps the fp32 accumulator tile in registers (on sm_100a it is loaded
        # from tensor memory for the epilogue); element-wise kernels hold their fp32 tile.
        regs = tile // threads + MODEL["regs_overhead"]
        if regs > spec.regs_per_thread:
            return Fit(False, "registers", 0, smem)
        limits.append(spec.regs_per_sm // (8 * math.ceil(regs / 8) * threads))  # allocated in units of 8
    if kdef.kind == "gemm" and "BLOCK_M" in cfg and "BLOCK_N" in cfg:
        if spec.tmem_cols:
            # fp32 accumulator: BLOCK_N columns per 128 rows (lanes); allocated in powers of two >= 32
            cols = max(32, pow2ceil(cfg["BLOCK_N"] * math.ceil(cfg["BLOCK_M"] / spec.tmem_lanes)))
            if cols > spec.tmem_cols:
                return Fit(False, "tmem", 0, smem)
            limits.append(spec.tmem_cols // cols)
    ctas = min(limits)
    return Fit(ctas >= 1, "" if ctas >= 1 else "occupancy", max(ctas, 0), smem)
