"""`rtn` algorithm: round-to-nearest with max-derived scales.

Each group's weights go through the scheme's weight quantizer as they are
(`Scheme.weights`: NVFP4's group-shared global scale, the recipe's MX rule, FP8 scales
rounded up to the model dtype; kernels/formats/quantizer.py) and are written
under compressed-tensors names (tfcompile/artifact/naming.py). The other algorithms
reuse `run_rtn` with their own weight quantizer (mse, gptq) or weights (awq).
With `quantize.scale_search=output` and the group's Hessian, the scales are chosen by the
layer's output error instead (output_scales.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from tfcompile.artifact.naming import ct_tensors
from tfcompile.calibration.hessian import hessians
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.ir import Job, LayerStats, Program, QuantTarget, load_target, register_algorithm
from tfcompile.kernels.formats import QTensor, dequantize_rows
from tfcompile.passes.quantize.output_scales import search_group
from tfcompile.rotate.online import rotate_weight
from tfcompile.schemes import Scheme

# (w [N, K], program, group global scale, source tensor name, model dtype) -> QTensor
QuantizeFn = Callable[[torch.Tensor, Program, "torch.Tensor | None", str, torch.dtype], QTensor]


def quantize_weight(w: torch.Tensor, program: Program, gscale: torch.Tensor | None, name: str,
                    model_dtype: torch.dtype) -> QTensor:
    """Round-to-nearest: the scheme's weight quantizer with the program's MX rule."""
    return program.weights.quantize(w, global_scale=gscale, rule=program.mx_rule,
                                           scale_dtype=model_dtype, name=name)


def group_input_amax(program: Program, members: Sequence[QuantTarget]) -> float | None:
    """The fused group's one static input amax (its members read the same input); None when
    the scheme's activations have no static scale."""
    acts = program.scheme.acts
    if acts is None or not acts.static:
        return None
    return max(program.act_amax[t.module] for t in members)


@register_algorithm("rtn")
def run_rtn(job: Job, program: Program, source: Checkpoint, quantizer: QuantizeFn | None = None,
            weights: list[torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], list[LayerStats]]:
    """Quantize one group; returns its output tensors and per-Linear stats.

    `quantizer` replaces round-to-nearest (the `mse` and `gptq` algorithms pass theirs).
    `weights` ([N, K] per member) replace the source's (AWQ passes W * s, float32); scales
    stay in the source dtype. Under an online transform (`program.online_hadamard`) the source's
    weights are quantized as W R (tfcompile/rotate/online.py)."""
    quantizer = quantizer or quantize_weight
    scheme, members = program.scheme, job.group.members
    src = [load_target(source, t) for t in members]
    model_dtype = src[0].dtype
    weights = [rotate_weight(w, program.online_hadamard) for w in src] if weights is None else weights
    gscale = program.weights.group_global_scale(weights, [t.source for t in members])
    amax = group_input_amax(program, members)
    searched, extra = searched_scales(job, program, weights, model_dtype) if quantizer is quantize_weight \
        else (None, {})
    out, stats = {}, []
    for t, w in zip(members, weights):
        q = searched.pop(0) if searched else quantizer(w, program, gscale, t.source, model_dtype)
        out.update(ct_tensors(q, scheme, t.module, amax, model_dtype))
        stats.append(dict(layer_stats(t, w, q, scheme, program.sqnr_rows), **extra,
                          **({"online_hadamard": program.online_hadamard} if program.online_hadamard else {})))
    return out, stats


def searched_scales(job: Job, program: Program, weights: list[torch.Tensor],
                    model_dtype: torch.dtype) -> tuple[list[QTensor] | None, dict]:
    """The group's RTN QTensors under scales chosen by output error (quantize.scale_search=output,
    output_scales.py), or (None, {}) when not asked for or the group has no Hessian."""
    h = hessians(program).get(job.group.key) if program.scale_search == "output" else None
    if h is None:
        return None, {}
    qs, rec = search_group(weights, [t.source for t in job.group.members], program, h, model_dtype)
    ratio = rec["out_err"] / rec["out_err_rtn"] if rec["out_err_rtn"] > 0 else 1.0
    return qs, {"scale_search": rec["scale_search"], "out_err_vs_rtn": round(ratio, 4)}


def layer_stats(t: QuantTarget, w: torch.Tensor, q: QTensor, scheme: Scheme, rows: int) -> LayerStats:
    """Weight SQNR (dB) on up to `rows` evenly spaced rows (all rows when rows=0)."""
    n = w.shape[0]
    idx = torch.arange(n) if rows <= 0 or rows >= n else torch.linspace(0, n - 1, rows).round().long()
    ref = w[idx].float()
    deq = dequantize_rows(q, idx)
    err = (ref - deq).pow(2).sum().item()
    sig = ref.pow(2).sum().item()
    sqnr = float("inf") if err == 0 else 10.0 * torch.log10(torch.tensor(sig / err)).item()
    return {"module": t.module, "format": scheme.name, "shape": list(t.shape),
            "sqnr_db": round(sqnr, 3) if sqnr != float("inf") else None}
