"""Scale choice by output error (`--set quantize.scale_search=output`), for NVFP4 and MXFP4.

RTN's scales follow from maxima alone: NVFP4's group global scale g = 2688 / amax and each
block's E4M3 scale E4M3(amax_block / 6 * g); MXFP4's E8M0 exponent from the block max. Many
other scales are as valid (the artifact is an ordinary checkpoint under any of them), and on a
sensitive model equally valid roundings span several percent of perplexity (issue 33: nudging g
by 2^-8 moves a Gemma-3-style model's perplexity by ~6%). Weight MSE does not rank them; the
layer's output error on the calibration activations can:

    err(Q) = ||X W^T - X Q^T||^2 / n = tr(D H D^T),   D = W - Q [N, K],   H = X^T X / n [K, K]

scored here by its block-diagonal part, sum over blocks b of d_b H_bb d_b^T with H_bb the b-th
diagonal [blk, blk] block of H: the cross-block terms pair independent rounding errors, and
without them the calibrate pass records only H's diagonal blocks (calibrate.hessian_blocks:
K / blk times less memory and time than the whole H, which a DeepSeek-V3 MoE layer's experts
need 57 GB for). On SmolLM2 the choice scored on the blocks alone was as accurate as the whole
H's (docs/accuracy.md "Defaults across models"); a fused group's members share H.
Candidates, per fusion group:
- global scales (NVFP4): g as computed, g rounded to bf16, g * (1 +- 2^-10), g * (1 +- 2^-8);
- per block, under each global scale: the RTN E4M3 scale code and its neighbours (code + 1:
  headroom; code - 1, - 2: clipping, the block max then saturates at 6); MXFP4: exponent
  e_rtn, e_rtn + 1 and e_rtn - 1 (clipping).
Each block is chosen by its own share of the output error, d_b H_bb d_b^T; then the group takes,
by those shares summed over its blocks and members, the best of these searched candidates and
plain RTN, so by that objective no group ends worse than RTN (tests/passes/test_output_scales.py).
It is the default of W4A4 NVFP4 RTN (passes/quantize/quantize.py `_searched_by_default`).
GPTQ (gptq.py) solves under the scales chosen here instead of RTN's.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import torch

from tfcompile.dist.devices import one_torch_thread
from tfcompile.ir import Program
from tfcompile.kernels import formats as F
from tfcompile.machine import heap_allocations

GLOBAL_FACTORS = (1.0, 1 + 2 ** -10, 1 - 2 ** -10, 1 + 2 ** -8, 1 - 2 ** -8)  # on g = 2688 / amax
CODE_OFFSETS = (0, 1, -1, -2)  # E4M3 scale code steps from RTN's (0 first: ties keep RTN)
MX_SHIFTS = (0, 1, -1)  # E8M0 exponent steps from RTN's
ROWS = 256  # rows per chunk: temporaries ~ ROWS x K x 4 bytes per candidate
MODES = ("none", "output", "gptq")  # "gptq": candidates scored after the solve (gptq.py solved_search)


def searchable(wq: F.WeightQuantizer) -> bool:
    """E2M1 codes under per-block scales: NVFP4 (block 16, shared global scale) or MXFP4 (32)."""
    return wq.element == "e2m1" and wq.block_scaled and wq.block in ((16,), (32,))


def scored_roundings(wq: F.WeightQuantizer) -> int:
    """Candidate roundings the search scores per weight of `wq`'s format: NVFP4 one per global
    candidate (`global_candidates`: g, bf16(g) and the GLOBAL_FACTORS nudges, at most), MXFP4 one;
    0 where it does not search."""
    if not searchable(wq):
        return 0
    return len(GLOBAL_FACTORS) + 1 if wq.shares_global_scale else 1


def output_error(w: torch.Tensor, vals: torch.Tensor, h: torch.Tensor) -> float:
    """tr(D H D^T) with D = w - vals [N, K] (float32), H [K, K]: the squared output error per token."""
    d = w.float() - vals.float()
    return float(((d @ h.float()) * d).sum())


def _block_err(d: torch.Tensor, hb: torch.Tensor) -> torch.Tensor:
    """d [R, B, blk], hb [B, blk, blk] -> each block's d_b H_bb d_b^T [R, B]."""
    return torch.einsum("rbi,bij,rbj->rb", d, hb, d)


def _pick(x: torch.Tensor, hb: torch.Tensor, mults: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, B, blk]; mults: each candidate's dequant multiplier [R, B]. Returns (index of the
    least block output error [R, B], its E2M1 codes [R, B, blk]); ties keep the earlier. Candidates
    are scored on grid values (F.round_e2m1); only the chosen multiplier's codes are encoded."""
    best_err = best_i = best_s = None
    for i, s in enumerate(mults):
        err = _block_err(F.round_e2m1(x / s[..., None]) * s[..., None] - x, hb)
        if best_err is None:
            best_err, best_i, best_s = err, torch.zeros_like(err, dtype=torch.long), s
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_i = torch.where(better, torch.full_like(best_i, i), best_i)
        best_s = torch.where(better, s, best_s)
    return best_i, F.encode_e2m1(x / best_s[..., None])


def diag_blocks(h: torch.Tensor, blk: int) -> torch.Tensor:
    """H [K, K] -> its diagonal blocks [K / blk, blk, blk] (float32); blocks already [K / blk, blk, blk]
    (what the calibrate pass records when only a scale search needs them) as they are."""
    if h.dim() == 3:
        return h.float()
    k = h.shape[0]
    hb = h.float().reshape(k // blk, blk, k // blk, blk)
    return hb.diagonal(dim1=0, dim2=2).permute(2, 0, 1).contiguous()


def block_error(w: torch.Tensor, vals: torch.Tensor, hb: torch.Tensor) -> float:
    """sum_b d_b H_bb d_b^T over every row and block, D = w - vals [N, K], hb [K / blk, blk, blk]: the
    output error with the cross-block terms of H left out (the search's objective)."""
    blk = hb.shape[-1]
    d = (w.float() - vals.float()).reshape(w.shape[0], -1, blk)
    return float(_block_err(d, hb).sum())


def nvfp4_search(w: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> F.QTensor:
    """NVFP4 of w [N, K] under global multiplier g (1,), each block's E4M3 scale code chosen among
    RTN's and its CODE_OFFSETS neighbours by the block's output error under H."""
    n, k = w.shape
    hb, gf = diag_blocks(h, 16), g.float().reshape(())
    packed, scales = [], []
    for r0 in range(0, n, ROWS):
        x = w[r0: r0 + ROWS].float().reshape(-1, k // 16, 16)
        code0 = F.cast_e4m3(x.abs().amax(-1) / F.E2M1_MAX * gf).view(torch.uint8).to(torch.int16)
        # codes 1..126: the smallest subnormal .. 448 (0 would divide by zero; 127 is NaN)
        cands = [(code0 + o).clamp(1, 126).to(torch.uint8).view(torch.float8_e4m3fn) for o in CODE_OFFSETS]
        idx, codes = _pick(x, hb, [s.float() / gf for s in cands])
        chosen = torch.stack([s.view(torch.uint8) for s in cands]).gather(0, idx[None]).squeeze(0)
        packed.append(F.pack_fp4(codes.reshape(x.shape[0], k)))
        scales.append(chosen.view(torch.float8_e4m3fn))
    return F.QTensor("nvfp4", torch.cat(packed), torch.cat(scales), g.float().reshape(1), (n, k), "group",
                     None, (16,))


def mxfp4_search(w: torch.Tensor, rule: str, h: torch.Tensor) -> F.QTensor:
    """MXFP4 of w [N, K], each block's E8M0 exponent chosen among the `rule` one and MX_SHIFTS
    steps from it by the block's output error under H."""
    n, k = w.shape
    hb = diag_blocks(h, 32)
    packed, scales = [], []
    for r0 in range(0, n, ROWS):
        x = w[r0: r0 + ROWS].float().reshape(-1, k // 32, 32)
        e0 = F.mx_shared_exponent(x.abs().amax(-1), "fp4", rule)
        exps = [(e0 + d).clamp(-127, 127) for d in MX_SHIFTS]
        idx, codes = _pick(x, hb, [torch.ldexp(torch.ones_like(e, dtype=torch.float32), e) for e in exps])
        packed.append(F.pack_fp4(codes.reshape(x.shape[0], k)))
        scales.append(F.encode_e8m0(torch.stack(exps).gather(0, idx[None]).squeeze(0)))
    return F.QTensor("mxfp4", torch.cat(packed), torch.cat(scales), None, (n, k), "group", rule, (32,))


def global_candidates(g: torch.Tensor) -> list[torch.Tensor]:
    """g (1,) float32, bf16(g), then g times each GLOBAL_FACTORS nudge (duplicates dropped)."""
    out: list[torch.Tensor] = []
    for c in [g.float(), g.to(torch.bfloat16).float(), *(g.float() * f for f in GLOBAL_FACTORS[1:])]:
        if all(not torch.equal(c, o) for o in out):
            out.append(c)
    return out


def search_group(weights: Sequence[torch.Tensor], names: Sequence[str], program: Program, h: torch.Tensor,
                 model_dtype: torch.dtype) -> tuple[list[F.QTensor], dict]:
    """A fusion group's QTensors (members share the input, hence H, and NVFP4's global scale):
    the candidate with the least summed output error, RTN included. Returns them and a record
    (errors of RTN and of the choice, which candidate). Every choice is scored by the block-diagonal
    part of H alone (`block_error`), so `h` may be just those blocks: [K / blk, blk, blk]."""
    # the same few MB of temporaries per candidate: reuse them (machine.py); one torch thread per op: the
    # work is elementwise ops on ~0.6 MB chunks, where a second OpenMP thread on a loaded 2-core machine
    # made one SmolLM2 gate/up group's search 4.2x slower (6.67 s against 1.59 s, load 6.7: a GPTQ run
    # with scale_search=output, which keeps every thread, spent ~25 min there against ~75 s idle); the
    # cores are used instead by running the candidates side by side (`_scored`: 1.55x on 2 cores)
    with heap_allocations(), one_torch_thread():
        return _search(weights, names, program, h, model_dtype)


def _search(weights: Sequence[torch.Tensor], names: Sequence[str], program: Program, h: torch.Tensor,
            model_dtype: torch.dtype) -> tuple[list[F.QTensor], dict]:
    wq = program.weights
    g0 = wq.group_global_scale(weights, names)
    rtn = [wq.quantize(w, global_scale=g0, rule=program.mx_rule, scale_dtype=model_dtype, name=n)
           for w, n in zip(weights, names)]
    hb = diag_blocks(h.to("cpu"), wq.block[0])

    def total(qs: list[F.QTensor]) -> float:
        return sum(block_error(w, F.dequantize(q, torch.float32), hb) for w, q in zip(weights, qs))

    best, best_err, label = rtn, total(rtn), "rtn"
    rtn_err = best_err
    if wq.shares_global_scale:
        makers = {f"g{i}": (lambda g=g: [nvfp4_search(w, g, h) for w in weights])
                  for i, g in enumerate(global_candidates(g0))}
    else:
        makers = {"blocks": lambda: [mxfp4_search(w, program.mx_rule, h) for w in weights]}
    for lab, (qs, err) in zip(makers, _scored(list(makers.values()), total)):
        if err < best_err:  # in candidate order, as one thread would: ties keep the earlier
            best, best_err, label = qs, err, lab
    return best, {"scale_search": label, "out_err_rtn": rtn_err, "out_err": best_err}


def search_workers() -> int:
    """Threads for a group's candidates: this process's cores (its CPU affinity), shared evenly by the
    processes torchrun started on the node (LOCAL_WORLD_SIZE)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


def _scored(makers: list[Callable[[], list[F.QTensor]]], total: Callable[[list[F.QTensor]], float]
            ) -> list[tuple[list[F.QTensor], float]]:
    """Each candidate's QTensors and summed error, in order. The candidates run on up to
    search_workers() threads, each op on one torch thread: a candidate is the same computation on
    any thread, so the choice and the bytes are those of one thread (the byte gate's W4A4 cases)."""
    def run(make):
        torch.set_num_threads(1)  # this thread's OpenMP team: one (the caller's count is restored after)
        qs = make()
        return qs, total(qs)

    workers = min(search_workers(), len(makers))
    if workers <= 1:
        return [run(m) for m in makers]
    with ThreadPoolExecutor(workers, thread_name_prefix="tfcompile-scale-search") as pool:
        return list(pool.map(run, makers))
