"""GPTQ for the calibrate pass's layer loop: the `LayerSolver` of calibration/propagate.py.

With `calibrate.propagate` (`--algorithm gptq`; off by default) each decoder layer is solved as
soon as its Hessians are complete, so the next layer is calibrated on this one's quantized
outputs. The solve is pack's (`gptq.group_qtensors`: the same RTN scales, GPTQ sweep, routed
experts in batches) under the recipe's quantize settings; pack later writes the codes it
produced (gptq.py `_run_solved`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import torch

from tfcompile.errors import RecipeError
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.ir import Program, QuantPlan, register_layer_solver
from tfcompile.kernels.formats import dequantize
from tfcompile.passes.quantize.gptq import group_qtensors
from tfcompile.passes.quantize.quantize import QuantizeConfig, group_job, mx_rule, nvfp4_weights


@register_layer_solver("gptq", loop="propagate")
class GPTQLayerSolver:
    """Quantizes the plan's groups layer by layer (calibration/propagate.py `LayerSolver`)."""

    def __init__(self, plan: QuantPlan, cfg: QuantizeConfig, source: Checkpoint, model_dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        if cfg.scale_search != "none":  # pack re-derives RTN's scales for the codes solved here
            raise RecipeError(f"quantize.scale_search={cfg.scale_search} does not combine with calibrate.propagate yet",
                              hint=f"drop one of --set calibrate.propagate=true / quantize.scale_search={cfg.scale_search}")
        self.jobs = {g.key: group_job(g, plan, model_dtype) for g in plan.groups}
        self.targets = {t.module: t for g in plan.groups for t in g.members}
        self.program = Program(plan.scheme, "gptq", (), {}, mx_rule(cfg, plan.scheme), 0,
                               gptq_act_order=cfg.gptq_act_order, gptq_damp=cfg.gptq_damp,
                               gptq_expert_batch=cfg.gptq_expert_batch, device=device,
                               nvfp4_weights=nvfp4_weights(cfg))
        self.source, self.dtype = source, model_dtype
        self.seconds: dict[str, float] = {}  # group key -> wall seconds of its quantization here

    def __call__(self, modules: set[str], hessians: Mapping[str, torch.Tensor],
                 owned: Callable[[str], bool]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        jobs = [j for k, j in self.jobs.items() if j.group.members[0].module in modules and owned(k)]
        # this layer's jobs and Hessians only: routed experts find their batch peers among them
        program = dataclasses.replace(self.program, jobs=tuple(jobs), hessians=dict(hessians), scratch={})
        codes, weights = {}, {}
        for job in jobs:
            t0 = time.perf_counter()
            key = job.group.key
            qs = group_qtensors(job, program, self.source)
            if key in hessians:
                codes[key] = torch.cat([q.data for q in qs])
            for t, q in zip(job.group.members, qs):
                weights[t.module] = dequantize(q, self.dtype)
            self.source.release()
            self.seconds[key] = time.perf_counter() - t0
        return codes, weights
