"""`signround` algorithm: learned rounding (SignRound / AutoRound) in the calibrate pass's layer loop.

Per decoder block, every Linear's rounding offsets V in [-0.5, 0.5] and per-block scale factors
alpha (signround_math.py) are tuned by signed gradient descent so the block, with its weights
quantized, reproduces the *original* block's output on the calibration activations:

    loss = mean((block_q(x_q) - block(x))^2)      x: the original model's input to the block
                                                  x_q: the input the quantized blocks before it give

as auto-round does it (intel/auto-round: `enable_quanted_input`, SignSGD, lr = 1 / iters decayed
linearly to 0, one random calibration batch per step, V and the scale factors at the same rate).
The float targets come from a second activation stream the layer loop keeps (calibration/
sequential.py); the quantized stream feeds the next block, as GPTQ's error propagation does.
Unlike auto-round, the kept parameters are the best of the starting point (RTN, or four over
six's scales) and a few checkpoints along the run, scored on *every* calibration batch, so a
block never ends worse than round-to-nearest on the calibration data.

The result is an ordinary NVFP4 / MXFP4 tensor (E2M1 codes, the format's own scales): pack writes
the tuned codes and block scales (kept per group as one uint8 tensor, `codes_of`) under the RTN
global scale. Routed experts that transformers holds fused (one [E, ...] parameter) are tuned as
slices of it (`tune_block`); an expert no calibration batch routes to keeps round-to-nearest, as
does a group the layer loop never reached.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch.func import functional_call

from tfcompile.calibration.propagate import Slot
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import broadcast_into
from tfcompile.dist.devices import one_torch_thread
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.jsonfile import JsonDict
from tfcompile.ir import (CalibStats, Job, LayerStats, Program, QuantPlan, load_target, register_algorithm,
                          register_layer_solver)
from tfcompile.kernels.formats import QTensor, dequantize
from tfcompile.passes.quantize.quantize import QuantizeConfig, group_job, mx_rule, nvfp4_weights
from tfcompile.passes.quantize.rtn import quantize_weight, run_rtn
from tfcompile.passes.quantize.signround_math import LearnedRounding
from tfcompile.reporter import Reporter
from tfcompile.schemes import Scheme

CHECKPOINTS = 4  # full-calibration scorings of the parameters along a block's run (+ the start); each costs
# one forward per calibration batch: at 8 they were half of a 16-step SmolLM2 run (profiled)


def supports(scheme: Scheme) -> str | None:
    w = scheme.weights
    if w.element == "e2m1" and w.block_scaled:
        return None
    return f"quantize.algorithm signround tunes E2M1 codes under block scales, not {scheme.name}"


def codes_of(qs: list[QTensor]) -> torch.Tensor:
    """A group's tuned tensors as one uint8 [sum N, K/2 + K/block]: per row its packed codes,
    then its block scales' bytes (E4M3 or E8M0)."""
    return torch.cat([torch.cat([q.data, q.scale.view(torch.uint8)], 1) for q in qs])


def _from_codes(q: QTensor, part: torch.Tensor) -> QTensor:
    """q (RTN's, for the global scale and layout) with the tuned codes and scales of `part`."""
    half = q.data.shape[1]
    return dataclasses.replace(q, data=part[:, :half].contiguous(),
                               scale=part[:, half:].contiguous().view(q.scale.dtype))


def _clone(obj):
    """Tensors in nested tuples/lists/dicts as float32 autograd-able copies (the loop's
    activations are inference tensors); other values as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone().float() if obj.is_floating_point() else obj.detach().clone()
    if isinstance(obj, (tuple, list)):
        return type(obj)(_clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Batches:
    """A block's calibration batches, held by one process or spread over torchrun's ranks (each
    rank holds the inputs and targets of its own batches). Every rank runs the same tuning: the
    step's batch is drawn from the global numbers, the rank holding it computes the gradient and
    broadcasts it (the others' zero buffers are overwritten: no sum, so the bits are the holder's),
    and a score is the mean of every batch's loss gathered and added in global order, as one
    process adds them. N ranks therefore keep the one-process parameters bit for bit."""

    def __init__(self, count: int, batch_ids: list[int] | None, world, tag: str):
        ids = list(range(count)) if batch_ids is None else list(batch_ids)
        self.world, self.tag, self.local = world, tag, {g: j for j, g in enumerate(ids)}
        held = world.all_objects(f"{tag}/batches", ids) if world.distributed else [ids]
        self.holder = {g: r for r, rank_ids in enumerate(held) for g in rank_ids}
        self.count = len(self.holder)

    def mean(self, losses: dict[int, float], k: int) -> float:
        """Mean of the per-batch losses (this rank's: global number -> loss) over every batch."""
        merged: dict[int, float] = {}
        for part in (self.world.all_objects(f"{self.tag}/score{k}", losses) if self.world.distributed
                     else [losses]):
            merged.update(part)
        return sum(merged[g] for g in range(self.count)) / self.count

    def share_grads(self, params: list[torch.Tensor], g: int) -> None:
        """Batch g's gradients, computed by the rank holding it, in every rank's `params`."""
        if not self.world.distributed:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        broadcast_into(self.world, [p.grad for p in params], self.holder[g])


def tune_block(layer: torch.nn.Module, rounders: dict[str, LearnedRounding], slots: dict[str, Slot], inputs: list,
               targets: list, *, iters: int, lr: float, seed: int, batches: Batches | None = None) -> JsonDict:
    """SignSGD on the rounders' V and alpha (module docstring). `rounders`: quantized module ->
    its rounder, whose weight sits at `slots[module]` in the layer (a whole parameter, or an
    expert's slice of a fused one: the fused tensor is rebuilt around the fake-quantized slices
    every step, so the gradient reaches each expert through its routed tokens only; an expert no
    batch routes to gets a zero gradient, sign 0, and stays at its start). `inputs`:
    [(hidden, kwargs)] per calibration batch this process holds (the quantized stream), `targets`:
    the original block's outputs; `batches`: where every batch lives (None: all here). Leaves
    every rounder at its best scored parameters; returns the block losses (start, kept).

    On the CPU it runs on one torch thread: most of its ops are elementwise on one weight, where an
    OpenMP team on a busy 2-core machine costs more than it gives (as GPTQ's sweep), and the bits
    then do not depend on the machine's thread count."""
    batches = batches or Batches(len(inputs), None, LOCAL, "")
    cpu = all(p.device.type == "cpu" for p in layer.parameters())
    with torch.inference_mode(False), torch.enable_grad(), one_torch_thread(cpu):
        whole = {slots[m].param: m for m in rounders if slots[m] == Slot(slots[m].param)}
        fixed = {n: p.detach().clone().float() for n, p in layer.named_parameters() if n not in whole}
        held = [(_clone(h), _clone(kw), _clone(t)) for (h, kw), t in zip(inputs, targets)]
        params = [p for r in rounders.values() for p in r.params()]

        def fake_weights() -> dict[str, torch.Tensor]:
            out = dict(fixed, **{n: rounders[m].fake() for n, m in whole.items()})
            sliced = [m for m in rounders if slots[m].param not in whole]
            for name in {slots[m].param for m in sliced}:
                out[name] = fixed[name].clone()  # the fused tensor, its tuned slices written below
            for m in sliced:
                slots[m].view(out).copy_(rounders[m].fake())  # autograd: CopySlices
            return out

        def loss_on(g: int, weights: dict | None = None) -> torch.Tensor:
            h, kw, t = held[batches.local[g]]
            weights = weights or fake_weights()
            return (_first(functional_call(layer, weights, (h,), kw)) - t).pow(2).mean()

        def score(k: int) -> float:  # the mean loss over every calibration batch
            with torch.no_grad():
                weights = fake_weights()
                return batches.mean({g: float(loss_on(g, weights)) for g in batches.local}, k)

        start = best = score(0)
        kept = [p.detach().clone() for p in params]
        gen = torch.Generator().manual_seed(seed)
        every = max(1, iters // CHECKPOINTS)
        for it in range(iters):
            g = int(torch.randint(batches.count, (1,), generator=gen))
            if g in batches.local:
                loss_on(g).backward()
            batches.share_grads(params, g)
            step = lr * (1.0 - it / iters)  # linear decay to 0 (auto-round's LinearLR)
            with torch.no_grad():
                for p in params:
                    p -= step * torch.sign(p.grad)
                    p.grad = None
            for r in rounders.values():
                r.clamp_()
            if (it + 1) % every == 0 or it + 1 == iters:
                if (s := score(it + 1)) < best:
                    best, kept = s, [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, k in zip(params, kept):
                p.copy_(k)
    return {"loss_start": start, "loss": best}


@register_layer_solver("signround", loop="always")
class SignRoundLayerSolver:
    """The layer loop's solver for `signround` (calibration/propagate.py `LayerSolver`, with
    `needs_block`: it is handed the bound block, its inputs and the original block's outputs)."""

    needs_block = True

    def __init__(self, plan: QuantPlan, cfg: QuantizeConfig, source: Checkpoint, model_dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.jobs = {g.key: group_job(g, plan, model_dtype) for g in plan.groups}
        self.targets = {t.module: t for g in plan.groups for t in g.members}
        self.program = Program(plan.scheme, "signround", (), {}, mx_rule(cfg, plan.scheme), 0, device=device,
                               nvfp4_weights=nvfp4_weights(cfg))
        self.cfg, self.source, self.dtype, self.device = cfg, source, model_dtype, device
        self.seconds: dict[str, float] = {}  # layer -> wall seconds of its tuning
        self.losses: dict[str, JsonDict] = {}  # layer -> block loss at the start and as kept

    def record(self, i: int) -> JsonDict:
        """Layer i's block losses, kept with its answer under calibrate.resume_dir."""
        loss = self.losses.get(str(i))
        return {} if loss is None else {"loss": loss}

    def restore(self, i: int, record: JsonDict) -> None:
        if "loss" in record:
            self.losses[str(i)] = record["loss"]

    def __call__(self, modules, statistics, owned, block=None):
        with torch.inference_mode(False):  # the layer loop's mode: its tensors cannot be tuned
            return self._solve(modules, owned, block)

    def _solve(self, modules, owned, block):
        # a block is tuned whole: under torchrun every rank tunes all its groups on the same steps
        # (Batches) and hands back the codes and weights of the groups it owns
        spread = block is not None and block.world.distributed
        jobs = [j for k, j in self.jobs.items() if j.group.members[0].module in modules and (spread or owned(k))]
        # tuned where the layer loop keeps the layer and its activations (calibrate.device)
        device = block.inputs[0][0].device if block is not None and block.inputs else self.device
        t0 = time.perf_counter()
        rounders, groups = {}, []  # local parameter name -> its rounder; (job, [(target, rounder|QTensor)])
        for job in jobs:
            program = self.program if job.scheme is None else dataclasses.replace(self.program, scheme=job.scheme)
            members = job.group.members
            weights = [load_target(self.source, t) for t in members]
            gscale = program.weights.group_global_scale(weights, [t.source for t in members])
            tuned = (block is not None and all(t.module in block.slots for t in members)
                     and program.scheme.weights.element == "e2m1")
            row = []
            for t, w in zip(members, weights):
                q = quantize_weight(w, program, gscale, t.source, w.dtype)
                if tuned:
                    rounders[t.module] = LearnedRounding(w, q, program.mx_rule, device, self.cfg.signround_scales)
                    row.append((t, rounders[t.module]))
                else:
                    row.append((t, q))
            groups.append((job, row))
        if rounders and block is not None:
            batches = Batches(len(block.inputs), block.batch_ids, block.world, f"signround/{block.index}")
            self.losses[str(block.index)] = tune_block(
                block.layer, rounders, block.slots, block.inputs, block.targets, iters=self.cfg.signround_iters,
                lr=self.cfg.signround_lr or 1.0 / self.cfg.signround_iters, seed=self.cfg.signround_seed + block.index,
                batches=batches)
        codes, weights = {}, {}
        for job, row in groups:
            if not owned(job.group.key):
                continue
            qs = [x.finish() if isinstance(x, LearnedRounding) else x for _, x in row]
            if any(isinstance(x, LearnedRounding) for _, x in row):  # the others: pack's RTN is the same
                codes[job.group.key] = codes_of(qs)
            for (t, _), q in zip(row, qs):
                weights[t.module] = dequantize(q, self.dtype)
        self.source.release()
        if block is not None:
            self.seconds[str(block.index)] = time.perf_counter() - t0
        return codes, weights


def _warn_unsolved(plan: QuantPlan, calib: CalibStats | None, source: Checkpoint, program: Program,
                   reporter: Reporter) -> tuple[Program, JsonDict]:
    """Before pack runs: name the groups the layer loop did not tune (they stay RTN)."""
    have = set(program.solved)
    missing = [j.group.key for j in program.jobs if j.group is not None and j.group.key not in have]
    if missing:
        reporter.warn(f"signround: {len(missing)} group(s) were not tuned in the layer loop; they are "
                      f"quantized round-to-nearest, e.g. {missing[0]}")
    return program, {"signround_untuned": len(missing)}


@register_algorithm("signround", prepare=_warn_unsolved, supports=supports,
                    hint="use --algorithm signround with --format nvfp4, nvfp4a16, mxfp4 or mxfp4a16",
                    calibrate={"mode": "sequential"})  # it tunes each block in the layer loop
def run_signround(job: Job, program: Program, source: Checkpoint) -> tuple[dict[str, torch.Tensor],
                                                                           list[LayerStats]]:
    """Write a group from the codes and scales the layer loop tuned (RTN when it has none)."""
    codes = program.solved.get(job.group.key)
    if codes is None:
        out, stats = run_rtn(job, program, source)
        return out, [dict(x, algorithm="rtn (not tuned)") for x in stats]
    parts = list(torch.split(codes, [t.shape[0] for t in job.group.members]))

    def quantizer(w, prog, gscale, name, model_dtype):
        return _from_codes(quantize_weight(w, prog, gscale, name, model_dtype), parts.pop(0))

    out, stats = run_rtn(job, program, source, quantizer=quantizer)
    return out, [dict(x, algorithm="signround") for x in stats]
