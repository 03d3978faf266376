"""GPTQ on MoE experts: one Hessian per expert, experts of one shape solved as a batch.

Each routed expert is quantized against the Hessian of the tokens routed to it
(calibration/moe.py records one per expert and projection group: gate/up share the
expert's input, down_proj has its own), never a layer-wide or fused one: GPTQ over a
fused [E*N, K] weight with one shared Hessian is the error that took a model's MMLU
from 82 to 25 in llm-compressor #2939. Experts routed fewer than
`calibrate.moe_min_tokens` tokens have no Hessian and stay RTN (the quantize pass
warns, listing them).

The column loop of GPTQ is Python-bound, so experts of one layer, projection and
shape are solved together: `gptq_values` on a [B, N, K] batch (B = experts x members,
`quantize.gptq_expert_batch` experts at a time, in expert order). Each expert's
result is its own problem's (batched Cholesky and matmuls; tests/families/test_moe.py
checks batch == one at a time). Memory: one batch of experts' weights in fp32 beside
their Hessians, held in the program's scratch until their jobs are written.
"""

from __future__ import annotations

import re
import time

import torch

from tfcompile.passes.quantize.program import load_target
from tfcompile.passes.quantize.rtn import group_global_scale, quantize_weight, run_rtn

_EXPERT_GROUP = re.compile(r"^(?P<parent>.*\.experts)\.(?P<e>\d+)\.(?P<role>[^.]+)$")


def is_expert_group(key: str) -> bool:
    return _EXPERT_GROUP.match(key) is not None


def run_gptq_experts(job, program, source, gptq_quantize, grid):
    """GPTQ outputs of one expert group, solved with the rest of its batch on first use."""
    key = job.group.key
    scratch = program.scratch
    if key not in scratch:
        _solve_batch(key, program, source, grid)
    vals = list(scratch.pop(key))
    solve = scratch.pop(key + "#seconds")

    def quantizer(w, scheme, prog, gscale, name, model_dtype):
        q = quantize_weight(w, scheme, prog, gscale, name, model_dtype)
        return gptq_quantize(q, vals.pop(0))

    out, stats = run_rtn(job, program, source, quantizer=quantizer)
    return out, [dict(x, algorithm="gptq", gptq_batch=True, timing={"solve_s": solve}) for x in stats]


def _batch_of(key: str, program) -> list:
    """The groups solved together with `key`: same experts module, role and shapes, with Hessians
    (the peer lists are built once per program, in program.scratch)."""
    me = _EXPERT_GROUP.match(key)
    index = program.scratch.get("#peers")
    if index is None:
        solved = set(program.hessians)  # keys only: membership on spilled Hessians would read them from disk
        index = {}
        for j in program.jobs:
            m = _EXPERT_GROUP.match(j.group.key) if j.group is not None else None
            if m and j.group.key in solved:
                index.setdefault((m["parent"], m["role"]), []).append(j.group)
        for peers in index.values():
            peers.sort(key=lambda g: int(_EXPERT_GROUP.match(g.key)["e"]))
        program.scratch["#peers"] = index
    peers = index[(me["parent"], me["role"])]
    size = max(1, program.gptq_expert_batch)
    at = next(i for i, g in enumerate(peers) if g.key == key)
    return peers[at - at % size: at - at % size + size]


def _solve_batch(key: str, program, source, grid) -> None:
    """Solve every member of key's batch; results go to program.scratch per group key."""
    from tfcompile.passes.quantize.gptq import gptq_values

    t0 = time.perf_counter()
    groups = _batch_of(key, program)
    ws, hs, ms, counts, fmt_grid = [], [], [], [], ""
    for g in groups:
        weights = [load_target(source, t) for t in g.members]
        gscale = group_global_scale(program.scheme, g.members, weights)
        h = program.hessians[g.key]
        for t, w in zip(g.members, weights):
            q = quantize_weight(w, program.scheme, program, gscale, t.source, w.dtype)
            m, fmt_grid = grid(q)
            ws.append(w.float())
            ms.append(m)
            hs.append(h)
        counts.append(len(g.members))
    shapes = {tuple(w.shape) for w in ws}
    if len(shapes) > 1:  # a batch is one shape by construction (same module, role)
        raise RuntimeError(f"gptq: expert batch of {key} mixes shapes {sorted(shapes)}")
    vals = gptq_values(torch.stack(ws), torch.stack(hs), torch.stack(ms), fmt_grid,
                       damp=program.gptq_damp, act_order=program.gptq_act_order)
    seconds = (time.perf_counter() - t0) / max(len(ws), 1)
    at = 0
    for g, n in zip(groups, counts):
        program.scratch[g.key] = vals[at: at + n]
        program.scratch[g.key + "#seconds"] = seconds
        at += n
