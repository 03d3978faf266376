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
experts e // `quantize.gptq_expert_batch` together, in expert order). Each expert's
result is its own problem's (batched Cholesky and matmuls; tests/families/test_moe_experts.py
checks batch == one at a time). Memory: one batch of experts' weights in fp32 beside
their Hessians, held in the program's scratch until their jobs are written.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from tfcompile.calibration.hessian import hessians
from tfcompile.families.experts import EXPERT_GROUP as _EXPERT_GROUP
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.ir import Job, LayerStats, Program, QuantGroup, load_target
from tfcompile.kernels.formats import QTensor, quantizer_of
from tfcompile.passes.quantize.quantize import QuantizeConfig
from tfcompile.passes.quantize.rtn import quantize_weight, run_rtn

# gptq.py's solver: (w, h, multipliers, grid quantizer, damp=, act_order=, device=) -> values, batched [B, N, K]
SolveFn = Callable[..., torch.Tensor]
EncodeFn = Callable[[QTensor, torch.Tensor], QTensor]  # (RTN QTensor, solved values) -> QTensor


def run_gptq_experts(job: Job, program: Program, source: Checkpoint, solve: SolveFn,
                     encode: EncodeFn) -> tuple[dict[str, torch.Tensor], list[LayerStats]]:
    """GPTQ outputs of one expert group, solved with the rest of its batch on first use."""
    key = job.group.key
    vals, seconds = solved_expert_values(key, program, source, solve)
    vals = list(vals)

    def quantizer(w, prog, gscale, name, model_dtype):
        q = quantize_weight(w, prog, gscale, name, model_dtype)
        return encode(q, vals.pop(0))

    out, stats = run_rtn(job, program, source, quantizer=quantizer)
    return out, [dict(x, algorithm="gptq", gptq_batch=True, timing={"solve_s": seconds}) for x in stats]


def solved_expert_values(key: str, program: Program, source: Checkpoint,
                         solve: SolveFn) -> tuple[torch.Tensor, float]:
    """Expert group `key`'s solved values [members, N, K] and solve seconds per member, its batch
    solved on first use (then forgotten here)."""
    if key not in program.scratch:
        _solve_batch(key, program, source, solve)
    return program.scratch.pop(key), program.scratch.pop(key + "#seconds")


def setting(program: Program, option: str):
    """GPTQ's option `option` in the program (quantize.gptq_{option}), else its default there."""
    if option in program.settings:
        return program.settings[option]
    return getattr(QuantizeConfig(), f"gptq_{option}")


def _batch_of(key: str, program: Program) -> list[QuantGroup]:
    """The groups solved together with `key`: same experts module, role and shapes, with Hessians,
    and expert indices in the same block of gptq_expert_batch (e // batch: the unit one rank owns
    under torchrun, tfcompile/dist/partition.py `solve_unit`; the peer lists are built once per
    program, in program.scratch)."""
    me = _EXPERT_GROUP.match(key)
    index = program.scratch.get("#peers")
    if index is None:
        solved = set(hessians(program))  # keys only: membership on spilled Hessians would read them from disk
        index = {}
        for j in program.jobs:
            m = _EXPERT_GROUP.match(j.group.key) if j.group is not None else None
            if m and j.group.key in solved:
                index.setdefault((m["parent"], m["role"]), []).append(j.group)
        for peers in index.values():
            peers.sort(key=lambda g: int(_EXPERT_GROUP.match(g.key)["e"]))
        program.scratch["#peers"] = index
    size = max(1, setting(program, "expert_batch"))
    block = int(me["e"]) // size
    return [g for g in index[(me["parent"], me["role"])] if int(_EXPERT_GROUP.match(g.key)["e"]) // size == block]


def _solve_batch(key: str, program: Program, source: Checkpoint, solve: SolveFn) -> None:
    """Solve every member of key's batch; results go to program.scratch per group key."""
    t0 = time.perf_counter()
    groups = _batch_of(key, program)
    ws, hs, ms, counts, grid = [], [], [], [], None
    weights_q = program.weights
    for g in groups:
        weights = [load_target(source, t) for t in g.members]
        gscale = weights_q.group_global_scale(weights, [t.source for t in g.members])
        h = hessians(program)[g.key]
        for t, w in zip(g.members, weights):
            q = quantize_weight(w, program, gscale, t.source, w.dtype)
            grid = quantizer_of(q)
            ws.append(w.float())
            ms.append(grid.multipliers(q))
            hs.append(h)
        counts.append(len(g.members))
    shapes = {tuple(w.shape) for w in ws}
    if len(shapes) > 1:  # a batch is one shape by construction (same module, role)
        raise RuntimeError(f"gptq: expert batch of {key} mixes shapes {sorted(shapes)}")
    vals = solve(torch.stack(ws), torch.stack(hs), torch.stack(ms), grid,
                 damp=setting(program, "damp"), act_order=setting(program, "act_order"), device=program.device)
    seconds = (time.perf_counter() - t0) / max(len(ws), 1)
    at = 0
    for g, n in zip(groups, counts):
        program.scratch[g.key] = vals[at: at + n]
        program.scratch[g.key + "#seconds"] = seconds
        at += n
