"""GPTQ (and RTN) for the calibrate pass's layer loop: the `LayerSolver` of calibration/propagate.py.

With `calibrate.propagate` (`--algorithm gptq`; off by default) each decoder layer is solved as
soon as its Hessians are complete, so the next layer is calibrated on this one's quantized
outputs. The solve is pack's (`gptq.group_qtensors`: the same RTN scales, GPTQ sweep, routed
experts in batches) under the recipe's quantize settings; pack later writes the codes it
produced (gptq.py `_run_solved`). `RTNLayerSolver` is the same without Hessians (round to
nearest, pack's RTN: its codes are not kept), so that with `calibrate.propagate` calibrated RTN
(W4A4 static input scales) observes each layer through the quantized layers before it.
Both fake-quantize a solved layer's inputs on its rerun (`input_quantizers`).
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
from tfcompile.calibration.hessian import NAME as HESSIAN
from tfcompile.passes.quantize.gptq import group_qtensors
from tfcompile.passes.quantize.quantize import QuantizeConfig, algorithm_settings, group_job, mx_rule, nvfp4_weights


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
                               settings=algorithm_settings(cfg, "gptq"), device=device,
                               nvfp4_weights=nvfp4_weights(cfg))
        self.source, self.dtype = source, model_dtype
        self.seconds: dict[str, float] = {}  # group key -> wall seconds of its quantization here

    def __call__(self, modules: set[str], statistics: Mapping[str, Mapping[str, torch.Tensor]],
                 owned: Callable[[str], bool]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        hessians = statistics.get(HESSIAN, {})
        jobs = [j for k, j in self.jobs.items() if j.group.members[0].module in modules and owned(k)]
        # this layer's jobs and Hessians only: routed experts find their batch peers among them
        program = dataclasses.replace(self.program, jobs=tuple(jobs), statistics={HESSIAN: dict(hessians)},
                                      scratch={})
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

    def input_quantizers(self, amax: Mapping[str, float]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """Module -> x -> its input quantized as the artifact's scheme quantizes it: a static kind with
        the scale pack stores for the fused group's amax (the max over its members: rtn.py
        `group_input_amax`), a dynamic kind as it is; only the groups whose every member has an
        amax (the layer being rerun, its routed experts that saw a token); none for weight-only
        schemes."""
        out = {}
        for job in self.jobs.values():
            members = [t.module for t in job.group.members]
            acts = (job.scheme or self.program.scheme).acts
            if acts is None or not all(m in amax for m in members):
                continue
            group_amax = max(amax[m] for m in members) if acts.static else None
            fn = acts.emulate(group_amax, self.dtype, name=job.group.key)
            out.update(dict.fromkeys(members, fn))
        return out


@register_layer_solver("rtn", loop="propagate")
class RTNLayerSolver(GPTQLayerSolver):
    """Round to nearest in the layer loop (module docstring): GPTQ's solver handed no Hessian."""

    def __call__(self, modules: set[str], statistics: Mapping[str, Mapping[str, torch.Tensor]],
                 owned: Callable[[str], bool]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return {}, super().__call__(modules, {}, owned)[1]
