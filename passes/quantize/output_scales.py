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
The blocks' errors are computed by kernels/formats/block_search.py (a C kernel, ~4 ns per weight
and global candidate on one core of a Xeon or an AVX2 build, ~20x the torch passes it replaced;
its torch reference is bit-identical), each in a fixed order of fp32 operations, and summed
exactly (math.fsum of each row's fp64 sum), so the choice is the same on every CPU and thread count.
It is the default of W4A4 NVFP4 RTN (passes/quantize/quantize.py `_searched_by_default`).
GPTQ (gptq.py) solves under the scales chosen here instead of RTN's.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import torch

from tfcompile.dist.devices import one_torch_thread
from tfcompile.ir import Program
from tfcompile.kernels import formats as F
from tfcompile.kernels.formats.block_search import search_blocks, tri
from tfcompile.machine import heap_allocations

GLOBAL_FACTORS = (1.0, 1 + 2 ** -10, 1 - 2 ** -10, 1 + 2 ** -8, 1 - 2 ** -8)  # on g = 2688 / amax
CODE_OFFSETS = (0, 1, -1, -2)  # E4M3 scale code steps from RTN's (0 first: ties keep RTN)
MX_SHIFTS = (0, 1, -1)  # E8M0 exponent steps from RTN's
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


def diag_blocks(h: torch.Tensor, blk: int) -> torch.Tensor:
    """H [K, K] -> its diagonal blocks [K / blk, blk, blk] (float32); blocks already [K / blk, blk, blk]
    (what the calibrate pass records when only a scale search needs them) as they are."""
    if h.dim() == 3:
        return h.float()
    k = h.shape[0]
    hb = h.float().reshape(k // blk, blk, k // blk, blk)
    return hb.diagonal(dim1=0, dim2=2).permute(2, 0, 1).contiguous()


def nvfp4_search(w: torch.Tensor, g: torch.Tensor, a: torch.Tensor) -> tuple[F.QTensor, torch.Tensor]:
    """NVFP4 of w [N, K] under global multiplier g (1,), each block's E4M3 scale code chosen among
    RTN's and its CODE_OFFSETS neighbours by the block's output error (a = block_search.tri of H's
    16 x 16 diagonal blocks). Returns it and each row's error [N] float64."""
    packed, codes, row_err = search_blocks(w, a, g=g, offsets=CODE_OFFSETS)
    q = F.QTensor("nvfp4", packed, codes.view(torch.float8_e4m3fn), g.float().reshape(1), tuple(w.shape),
                  "group", None, (16,))
    return q, row_err


def mxfp4_search(w: torch.Tensor, rule: str, a: torch.Tensor) -> tuple[F.QTensor, torch.Tensor]:
    """MXFP4 of w [N, K], each block's E8M0 exponent chosen among the `rule` one and MX_SHIFTS
    steps from it by the block's output error (a from H's 32 x 32 diagonal blocks)."""
    packed, codes, row_err = search_blocks(w, a, rule=rule, offsets=MX_SHIFTS)
    return F.QTensor("mxfp4", packed, codes, None, tuple(w.shape), "group", rule, (32,)), row_err


def rtn_error(w: torch.Tensor, q: F.QTensor, a: torch.Tensor) -> torch.Tensor:
    """Each row's error [N] float64 of an RTN NVFP4/MXFP4 tensor of w, by the search's objective (its
    scale codes given, one candidate: the same arithmetic as the searched ones)."""
    codes = q.scale.view(torch.uint8)
    if q.global_scale is not None:  # E4M3 block scales under the global multiplier
        return search_blocks(w, a, g=q.global_scale, fixed=codes)[2]
    return search_blocks(w, a, rule=q.rule, fixed=codes)[2]


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
    part of H alone (block_search.py), so `h` may be just those blocks: [K / blk, blk, blk]."""
    # the candidates are scored by the C kernel (kernels/formats/block_search.py), side by side on the
    # process's cores (`_scored`); where there is no compiler its torch reference does elementwise ops
    # on ~0.6 MB chunks, where a second OpenMP thread on a loaded 2-core machine made one SmolLM2
    # gate/up group's search 4.2x slower (6.67 s against 1.59 s, load 6.7), hence one torch thread
    # per candidate and reused temporaries (machine.py heap_allocations)
    with heap_allocations(), one_torch_thread():
        return _search(weights, names, program, h, model_dtype)


def _search(weights: Sequence[torch.Tensor], names: Sequence[str], program: Program, h: torch.Tensor,
            model_dtype: torch.dtype) -> tuple[list[F.QTensor], dict]:
    wq = program.weights
    g0 = wq.group_global_scale(weights, names)
    rtn = [wq.quantize(w, global_scale=g0, rule=program.mx_rule, scale_dtype=model_dtype, name=n)
           for w, n in zip(weights, names)]
    a = tri(diag_blocks(h.to("cpu"), wq.block[0]))

    def total(row_errs: list[torch.Tensor]) -> float:  # exactly rounded: the same on any split into threads
        return math.fsum(torch.cat(row_errs).tolist())

    best, best_err, label = rtn, total([rtn_error(w, q, a) for w, q in zip(weights, rtn)]), "rtn"
    rtn_err = best_err
    if wq.shares_global_scale:
        makers = {f"g{i}": (lambda g=g: [nvfp4_search(w, g, a) for w in weights])
                  for i, g in enumerate(global_candidates(g0))}
    else:
        makers = {"blocks": lambda: [mxfp4_search(w, program.mx_rule, a) for w in weights]}
    for lab, found in zip(makers, _scored(list(makers.values()))):
        err = total([e for _, e in found])
        if err < best_err:  # in candidate order, as one thread would: ties keep the earlier
            best, best_err, label = [q for q, _ in found], err, lab
    return best, {"scale_search": label, "out_err_rtn": rtn_err, "out_err": best_err}


def search_workers() -> int:
    """Threads for a group's candidates: this process's cores (its CPU affinity), shared evenly by the
    processes torchrun started on the node (LOCAL_WORLD_SIZE)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


def _scored(makers: list[Callable[[], list]]) -> list[list]:
    """Each candidate's (QTensor, row errors) per member, in order. The candidates run on up to
    search_workers() threads, the kernel of each on that many cores over the candidates (at least
    one): a candidate's bytes and row errors do not depend on threads, so the choice and the bytes
    are those of one thread (the byte gate's W4A4 cases)."""
    cores = search_workers()
    workers = min(cores, len(makers))
    per = max(1, cores // len(makers))  # MXFP4's one candidate: the kernel takes every core by rows

    def run(make):
        torch.set_num_threads(per)  # this thread's OpenMP team and kernel slices (the caller's restored after)
        return make()

    if workers <= 1:
        return [run(m) for m in makers]
    with ThreadPoolExecutor(workers, thread_name_prefix="tfcompile-scale-search") as pool:
        return list(pool.map(run, makers))
