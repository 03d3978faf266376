"""Analytic cost model: predicted run time of one kernel config on one problem.

For T = prod(grid) blocks on S SMs with c resident blocks per SM, a tile of
BLOCK_M x BLOCK_N x K_split (K_split = K / SPLIT_K) and stage = smem_bytes /
num_stages bytes of operands per K step (BLOCK_K):

- compute: the SM with the most tiles sets the time, and a tile runs its padded
  size on the tensor cores: ceil(T / S) * 2 * BLOCK_M * BLOCK_N * K_split /
  (peak / S * mma_efficiency * feed * pipe). The padding is why M = 1 prefers
  narrow tiles or split-K, and a partial last round costs a whole one (wave
  quantization). Two efficiencies, both from the operand bytes one flop needs,
  b = stage / (2 * BLOCK_M * BLOCK_N * BLOCK_K):
    feed = min(1, SM shared-memory bandwidth / (SM peak * b)): small tiles
           cannot feed the tensor cores from shared memory;
    pipe = min(1, bytes in flight per SM / (SM peak * b * DRAM latency)):
           Little's law, with (num_stages - 1) stages in flight per resident
           block -- a shallow pipeline stalls on every load.
- memory: the kernel's `bytes_moved(m, n, k)` (plus split-K's fp32 partial
  sums, written and read once) at min(HBM peak * efficiency, busy SMs * what
  one SM can draw, bytes in flight on the whole GPU / DRAM latency).
- time = max(compute, memory) (overlapped; summed when num_stages = 1), plus
  one DRAM latency per wave of blocks (pipeline fill), plus a launch, plus one
  more with split-K (zeroing or reduction).
Operand re-reads between tiles are assumed to hit L2 (grouped tile order).

Constants: hardware.FACTS (sourced) and hardware.MODEL (assumptions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfcompile.tune.hardware import MODEL, TargetSpec
from tfcompile.tune.registry import mma_class
from tfcompile.tune.shapes import Problem
from tfcompile.tune.space import Fit


@dataclass(frozen=True)
class Estimate:
    us: float  # predicted time, microseconds
    bound: str  # "compute" | "memory"
    tiles: int  # blocks in the grid
    waves: int  # ceil(tiles / (SMs * resident blocks per SM))
    compute_us: float
    memory_us: float


def estimate(kdef, p: Problem, cfg: dict, spec: TargetSpec, f: Fit) -> Estimate:
    tiles = math.prod(kdef.grid(p.m, p.n, p.k, cfg))
    waves = math.ceil(tiles / (spec.sms * f.ctas_per_sm))
    split = int(cfg.get("SPLIT_K", 1))
    compute = _compute_s(kdef, p, cfg, spec, f, tiles, split)
    dram = float(kdef.bytes_moved(p.m, p.n, p.k)) + (2 * split * p.m * p.n * 4 if split > 1 else 0)
    memory = dram / _bandwidth(cfg, spec, f, tiles, dram)
    stages = int(cfg.get("num_stages", 1))
    body = max(compute, memory) if stages > 1 else compute + memory
    lat = MODEL["dram_latency_us"] * 1e-6
    launches = 1 + (split > 1)
    total = body + waves * lat + launches * MODEL["launch_us"] * 1e-6
    return Estimate(total * 1e6, "compute" if compute >= memory else "memory", tiles, waves,
                    compute * 1e6, memory * 1e6)


def _compute_s(kdef, p: Problem, cfg: dict, spec: TargetSpec, f: Fit, tiles: int, split: int) -> float:
    """Seconds of tensor-core work on the busiest SM (0 for kernels without an MMA)."""
    cls = mma_class(kdef, p.target)
    if cls is None:
        return 0.0
    sm_peak = spec.peak_tflops[cls] * 1e12 / spec.sms  # flop/s of one SM
    if sm_peak <= 0:
        return math.inf  # no tensor cores for this precision on the target
    bm, bn, bk = cfg.get("BLOCK_M"), cfg.get("BLOCK_N"), cfg.get("BLOCK_K")
    if not (bm and bn and bk):  # a kernel without tile knobs: its own flop count over the grid
        return math.ceil(tiles / spec.sms) * float(kdef.flops(p.m, p.n, p.k)) / max(tiles, 1) / sm_peak
    stages = max(1, int(cfg.get("num_stages", 1)))
    per_flop = (f.smem / stages) / (2.0 * bm * bn * bk) if f.smem else 0.0  # operand bytes per flop
    feed = min(1.0, spec.smem_gbps_per_sm * 1e9 / (sm_peak * per_flop)) if per_flop else 1.0
    per_sm = min(f.ctas_per_sm, math.ceil(tiles / spec.sms))  # resident blocks actually used
    in_flight = per_sm * max(stages - 1, 1) * f.smem / stages
    need = sm_peak * per_flop * MODEL["dram_latency_us"] * 1e-6
    pipe = min(1.0, in_flight / need) if need else 1.0
    rate = sm_peak * MODEL["mma_efficiency"] * feed * pipe
    return math.ceil(tiles / spec.sms) * 2.0 * bm * bn * math.ceil(p.k / split) / rate


def _bandwidth(cfg: dict, spec: TargetSpec, f: Fit, tiles: int, dram: float) -> float:
    """Achievable bytes/s: HBM peak, what the busy SMs can draw, or what the loads in flight
    sustain (Little's law)."""
    stages = max(1, int(cfg.get("num_stages", 1)))
    active = min(tiles, spec.sms * f.ctas_per_sm)
    per_block = f.smem / stages if f.smem else dram / max(tiles, 1)  # no smem: one block's whole share
    in_flight = active * max(stages - 1, 1) * per_block
    peak = spec.hbm_tbps * 1e12 * MODEL["hbm_efficiency"]
    per_sm = peak / spec.sms * MODEL["sm_share_max"]  # what one SM's loads can draw
    return max(1.0, min(peak, min(tiles, spec.sms) * per_sm, in_flight / (MODEL["dram_latency_us"] * 1e-6)))
