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

from tfcompile.calibration.moe_policy import summarize
from tfcompile.calibration.hessian import NAME as HESSIAN
from tfcompile.calibration.hessian import hessians
from tfcompile.dist.devices import one_torch_thread
from tfcompile.errors import RecipeError
from tfcompile.families.experts import is_expert_group
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.jsonfile import JsonDict
from tfcompile.ir import CalibStats, Job, LayerStats, Program, QuantPlan, load_target, register_algorithm
from tfcompile.kernels import formats as F
from tfcompile.passes.quantize.gptq_cost import COST
from tfcompile.passes.quantize.gptq_moe import run_gptq_experts, setting, solved_expert_values
from tfcompile.passes.quantize.output_scales import global_candidates, output_error, search_group
from tfcompile.passes.quantize.rtn import quantize_weight, run_rtn, searched_scales
from tfcompile.reporter import Reporter
from tfcompile.rotate.online import rotate_hessian

DAMP = 0.01
BLOCK = 128


class NotPositiveDefinite(RecipeError):
    """H + damp * mean(diag H) I has no Cholesky factor: H of rank below K (fewer calibration tokens
    than inputs) whose rounding (a bf16 Hessian: calibrate.hessian_dtype=compute) outweighs the damping."""

    def __init__(self, message: str):
        super().__init__(message, hint="raise the dampening (--set quantize.gptq_damp=0.1), calibrate on more "
                                       "tokens (--calib-samples), or keep calibrate.hessian_dtype=float32")


def _inverse_hessian(h: torch.Tensor, w: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factors of (H + damp*mean(diag) I)^-1, batched [B, K, K]; dead inputs pinned to 1.

    Called on one CPU thread (`_sweep`): MKL's blocked Cholesky gives different bits for
    different thread counts (measured, K=256: 1 vs 2 threads differ), and a torchrun rank has
    fewer threads than one process, so this keeps GPTQ byte-identical for any number of
    processes (the matmuls were measured thread-count invariant)."""
    h = h.clone()
    diag = h.diagonal(dim1=1, dim2=2)
    dead = diag == 0  # [B, K]
    diag[dead] = 1.0
    w.masked_fill_(dead[:, None, :], 0.0)
    h += torch.eye(h.shape[-1], device=h.device) * (damp * diag.mean(1))[:, None, None]
    try:
        return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    except torch.linalg.LinAlgError as e:
        raise NotPositiveDefinite(f"GPTQ's damped Hessian (K = {h.shape[-1]}, dampening {damp}) is not "
                                  f"positive definite: {str(e).split(': ', 1)[-1]}") from None


def _whole(h: torch.Tensor | None, key: str) -> torch.Tensor | None:
    """GPTQ solves with the whole H [K, K]; calibrate.hessian_blocks records only its diagonal blocks."""
    if h is not None and h.dim() != 2:
        raise RecipeError(f"{key}: GPTQ needs the whole Hessian, and calibration recorded only its diagonal "
                          f"blocks {tuple(h.shape)} (calibrate.hessian_blocks)",
                          hint="drop --set calibrate.hessian_blocks (GPTQ's runs record the whole H by default)")
    return h


def gptq_values(w: torch.Tensor, h: torch.Tensor, m: torch.Tensor, grid: F.WeightQuantizer, *,
                damp: float = DAMP, act_order: bool = True, block: int = BLOCK,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Quantized values (dequantized, float32, on the CPU) of w [N, K] under fixed multipliers m
    [N, K] and Hessian h [K, K], rounded on `grid`'s element grid (its `round_to_grid`); or of a
    batch [B, N, K] / [B, K, K] solved together (MoE experts of one shape:
    passes/quantize/gptq_moe.py), each exactly as it would be alone up to float rounding.
    Computed on `device` (the final encoding is the caller's, on the CPU)."""
    single = w.dim() == 2
    if single:
        w, h, m = w[None], h[None], m[None]
    w = w.to(device=device, dtype=torch.float32, copy=True)
    h, m = h.to(device=device, dtype=torch.float32), m.to(device=device, dtype=torch.float32)
    b, n, k = w.shape
    # stable: ties (e.g. dead inputs) keep index order on every device and thread count
    perm = (torch.argsort(h.diagonal(dim1=1, dim2=2), dim=1, descending=True, stable=True) if act_order
            else torch.arange(k, device=w.device).expand(b, k))
    inv = torch.argsort(perm, dim=1)
    cols = perm[:, None, :].expand(b, n, k)
    w, m = w.gather(2, cols), m.gather(2, cols)
    h = h[torch.arange(b, device=w.device)[:, None, None], perm[:, :, None], perm[:, None, :]]
    with one_torch_thread(w.device.type == "cpu"):
        out = _sweep(w, m, h, grid, damp, block).gather(2, inv[:, None, :].expand(b, n, k)).cpu()
    return out[0] if single else out


def _sweep(w, m, h, grid: F.WeightQuantizer, damp: float, block: int) -> torch.Tensor:
    """The column sweep (columns already in visiting order), [B, N, K]. On the CPU it runs on one
    thread: its ops are column-sized, and an OpenMP team per op cost 4.4x on this 2-core machine
    under load (demo LM GPTQ quantize: 17 s with 1 thread, 75 s with 2)."""
    b, n, k = w.shape
    hinv = _inverse_hessian(h, w, damp)
    out = torch.zeros_like(w)
    for c0 in range(0, k, block):
        c1 = min(c0 + block, k)
        wb, errs = w[:, :, c0:c1].clone(), torch.zeros(b, n, c1 - c0, device=w.device)
        hb = hinv[:, c0:c1, c0:c1]
        for j in range(c1 - c0):
            col, mj = wb[:, :, j], m[:, :, c0 + j]
            q = grid.round_to_grid(col / mj) * mj
            out[:, :, c0 + j] = q
            e = (col - q) / hb[:, j, j, None]
            wb[:, :, j + 1:] -= e[:, :, None] * hb[:, None, j, j + 1:]
            errs[:, :, j] = e
        w[:, :, c1:] -= errs @ hinv[:, c0:c1, c1:]  # lazy batch update of the remaining columns
    return out


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, q_rtn: F.QTensor, **opts) -> F.QTensor:
    """Re-encode w by GPTQ under q_rtn's fixed scales; returns a QTensor of the same format.
    `device=` runs the sweep there; the encoding below is the CPU reference's either way."""
    wq = F.quantizer_of(q_rtn)
    m = wq.multipliers(q_rtn)  # each element's dequant multiplier under the fixed RTN scales
    return encode(q_rtn, gptq_values(w, h, m, wq, **opts))  # exactly code * multiplier for every element


def encode(q_rtn: F.QTensor, vals: torch.Tensor) -> F.QTensor:
    """q_rtn with its codes replaced by `vals` (float32, each exactly a code times q_rtn's multiplier)."""
    wq = F.quantizer_of(q_rtn)
    elems = vals / wq.multipliers(q_rtn)  # exact element values on the grid (division by the same multiplier)
    return dataclasses.replace(q_rtn, data=wq.encode(elems))


def solved_search(weights: list[torch.Tensor], names: list[str], program: Program, h: torch.Tensor,
                  model_dtype: torch.dtype) -> tuple[list[F.QTensor], dict]:
    """quantize.scale_search=gptq: a fusion group's GPTQ solved under each candidate set of scales,
    the one with the least summed output error tr(D H D^T) *after* its solve kept (GPTQ's error
    feedback re-rounds every column, so the scales best for RTN need not be best for GPTQ:
    docs/accuracy.md). Candidates: NVFP4's global scales (output_scales.global_candidates: g,
    bf16(g), g(1 +- 2^-10), g(1 +- 2^-8)) each with RTN's block scales (the `output` search of
    every E4M3 neighbour is left out: on a 3072 x 576 pair it cost ~16x a plain solve); MXFP4's
    RTN exponents and those `quantize.scale_search=output` chooses (E8M0 neighbours, clipping).
    The first candidate is plain GPTQ (ties keep it). Cost: one batched sweep over the candidates
    (<= 6) and the group's members, whose rows are independent given the shared H (measured on a
    3072 x 576 pair: 3.2x a plain solve).
    Returns the QTensors and a record (the choice, its error as a share of plain GPTQ's)."""
    wq, hf = program.weights, h.float().cpu()

    def rtn(g):
        return [wq.quantize(w, global_scale=g, rule=program.mx_rule, scale_dtype=model_dtype, name=n)
                for w, n in zip(weights, names)]

    g0 = wq.group_global_scale(weights, names)
    if wq.shares_global_scale:
        cands = [(f"g{i}", rtn(g)) for i, g in enumerate(global_candidates(g0))]
    else:  # MXFP4: RTN's exponents and the output choice (3 per block: cheap, unlike NVFP4's 6 x 4)
        cands = [("rtn", rtn(None)), ("output", search_group(weights, names, program, h, model_dtype)[0])]
    c, ns = len(cands), [w.shape[0] for w in weights]
    w_cat = torch.cat([w.float() for w in weights])  # [sum N, K]
    m = torch.stack([torch.cat([wq.multipliers(q) for q in qs]) for _, qs in cands])  # [C, sum N, K]
    vals = gptq_values(w_cat.repeat(c, 1, 1), hf.repeat(c, 1, 1), m, wq, act_order=setting(program, "act_order"),
                       damp=setting(program, "damp"), device=program.device)  # [C, sum N, K]
    errs = [output_error(w_cat, v, hf) for v in vals]
    i = min(range(c), key=lambda j: (errs[j], j))  # ties keep the earlier (plain GPTQ first)
    qs = [encode(q, v) for q, v in zip(cands[i][1], vals[i].split(ns))]
    ratio = round(errs[i] / errs[0], 4) if errs[0] > 0 else 1.0
    return qs, {"scale_search": cands[i][0], "out_err_vs_gptq": ratio}


def _warn_rtn(plan: QuantPlan, calib: CalibStats | None, source: Checkpoint, program: Program,
              reporter: Reporter) -> tuple[Program, JsonDict]:
    """Before pack runs: name the groups that stay RTN for want of a Hessian (experts routed fewer
    than calibrate.moe_min_tokens tokens, or modules no token reached)."""
    have = set(hessians(program)) | set(program.solved)  # keys only: never read a spilled tensor here
    missing = [t.module for j in program.jobs if j.group is not None and j.group.key not in have
               for t in j.group.members]
    if missing:
        min_tokens = calib.moe_min_tokens if calib is not None else 0
        reporter.warn(f"gptq: {len(missing)} Linear(s) have no Hessian (experts routed fewer than "
                      f"{min_tokens} calibration tokens, or never reached); "
                      f"they are quantized round-to-nearest: {summarize(missing)}")
    return program, {"rtn_no_hessian": len(missing)}


@register_algorithm("gptq", prepare=_warn_rtn, calibrate={HESSIAN: True},  # the statistic's switch
                    cost=COST)  # for `plan --estimate` (gptq_cost.py)
def run_gptq(job: Job, program: Program, source: Checkpoint) -> tuple[dict[str, torch.Tensor], list[LayerStats]]:
    """GPTQ with the group's shared Hessian (q/k/v and gate/up share one input); routed experts
    with their own Hessians, solved in batches (gptq_moe.py). A group the calibrate pass already
    solved (calibrate.propagate) is written from its codes."""
    codes = program.solved.get(job.group.key)
    if codes is not None:
        return _run_solved(job, program, source, codes)
    h = _whole(hessians(program).get(job.group.key), job.group.key)
    if h is not None:  # the Hessian of the inputs the stored W R sees, x R (identity without a transform)
        h = rotate_hessian(h, program.online_hadamard)
    if h is None:  # too few calibration tokens reached it: RTN, and say so (warned by _warn_rtn)
        out, stats = run_rtn(job, program, source)
        return out, [dict(x, algorithm="rtn (no Hessian)") for x in stats]
    if is_expert_group(job.group.key):
        return run_gptq_experts(job, program, source, gptq_values, encode)

    solve: list[float] = []  # seconds per member, in member order
    weights, searched, solved, extra = None, None, None, {}
    if program.scale_search in ("output", "gptq"):
        weights = [load_target(source, t) for t in job.group.members]
    if program.scale_search == "output":  # GPTQ under the scales chosen by RTN's output error
        searched, extra = searched_scales(job, program, weights, weights[0].dtype)
    elif program.scale_search == "gptq":  # candidates scored after their GPTQ solves
        t0 = time.perf_counter()
        solved, extra = solved_search(weights, [t.source for t in job.group.members], program, h,
                                      weights[0].dtype)
        solve += [(time.perf_counter() - t0) / len(weights)] * len(weights)

    def quantizer(w, prog, gscale, name, model_dtype):
        if solved:
            return solved.pop(0)
        t0 = time.perf_counter()
        q = searched.pop(0) if searched else quantize_weight(w, prog, gscale, name, model_dtype)
        try:
            q = gptq_quantize(w, h, q, act_order=setting(prog, "act_order"), damp=setting(prog, "damp"),
                              device=prog.device)
        except NotPositiveDefinite as e:
            raise NotPositiveDefinite(f"{name}: {e.message}") from None
        solve.append(time.perf_counter() - t0)
        return q

    out, stats = run_rtn(job, program, source, quantizer=quantizer, weights=weights)
    # "timing" is reported by pack and kept out of the manifest (it would break byte-identical reruns)
    return out, [dict(x, algorithm="gptq", **extra, timing={"solve_s": s}) for x, s in zip(stats, solve)]


def _run_solved(job: Job, program: Program, source: Checkpoint,
                codes: torch.Tensor) -> tuple[dict[str, torch.Tensor], list[LayerStats]]:
    """A group solved in the calibrate pass's layer loop: each member's RTN scales (the same
    function of the same weights as the solve's) with the solved codes in place of RTN's."""
    parts = list(torch.split(codes, [t.shape[0] for t in job.group.members]))

    def quantizer(w, prog, gscale, name, model_dtype):
        q = quantize_weight(w, prog, gscale, name, model_dtype)
        return dataclasses.replace(q, data=parts.pop(0))

    out, stats = run_rtn(job, program, source, quantizer=quantizer)
    batched = {"gptq_batch": True} if is_expert_group(job.group.key) else {}  # as gptq_moe.py says it
    return out, [dict(x, algorithm="gptq", **batched) for x in stats]


def group_qtensors(job: Job, program: Program, source: Checkpoint) -> list[F.QTensor]:
    """The group's members quantized as `run_gptq` quantizes them from the program's Hessians: GPTQ
    with its Hessian (routed experts solved with their batch), RTN without one."""
    members, key = job.group.members, job.group.key
    if job.scheme is not None:  # a mixed-precision group (tfcompile/ir.py `execute`)
        program = dataclasses.replace(program, scheme=job.scheme)
    weights = [load_target(source, t) for t in members]
    gscale = program.weights.group_global_scale(weights, [t.source for t in members])
    h = _whole(hessians(program).get(key), key)
    vals = None
    if h is not None and is_expert_group(key):
        vals = list(solved_expert_values(key, program, source, gptq_values)[0])
    if h is not None and vals is None and program.scale_search == "gptq":
        return solved_search(weights, [t.source for t in members], program, h, weights[0].dtype)[0]
    out = []
    searched = searched_scales(job, program, weights, weights[0].dtype)[0] if vals is None else None
    for t, w in zip(members, weights):
        q = searched.pop(0) if searched else quantize_weight(w, program, gscale, t.source, w.dtype)
        if vals is not None:
            q = encode(q, vals.pop(0))
        elif h is not None:
            q = gptq_quantize(w, h, q, act_order=setting(program, "act_order"), damp=setting(program, "damp"),
                              device=program.device)
        out.append(q)
    return out
