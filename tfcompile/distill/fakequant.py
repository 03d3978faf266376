"""Fake quantization with straight-through gradients, by the same rules pack uses.

Forward values come from tfcompile.kernels.formats, quantized then dequantized
to float32, so the student sees exactly the weights the artifact will hold.
`impl` chooses the plain-torch reference ("reference") or, by default ("auto"),
the fused C kernels that pack itself runs, which tests/kernels prove
bit-identical to the reference and which are 10-40x faster here (a 2048x768
MXFP4 activation: 25 ms vs 0.94 s on the 2-core build machine); a test checks
the student's outputs are identical either way. Backward is the straight-through
estimator: d(fq(x))/dx = 1 (Bengio et al. 2013), because rounding has a zero
derivative almost everywhere.

Weights and activations go through the quantizers pack and `tfcompile eval` use
(`Program.weights`: the scheme's, or four over six's under
quantize.nvfp4_scales=four_over_six; `Scheme.acts`; kernels/formats/quantizer.py),
so the rules are the artifact's by construction:
- NVFP4: one global scale per fusion group (q/k/v, gate/up), 2688 / the group's
  max |w| (4/6: 1536 / max |w|, each block's max mapped to 6 or 4), recomputed from the current weights at every forward (no gradient
  flows through it: it is a max over ~1e5 elements).
- MXFP4 / MXFP8: E8M0 block scales by the recipe's rule (floor or ceil).
- FP8: scale amax/448 rounded up to the model dtype, data quantized with it.
Activations (W4A4/W8A8 schemes), as tfcompile eval emulates them: NVFP4 with the
calibrated static global scale (shared by the group, as pack writes
`input_global_scale`), MXFP4/MXFP8 dynamic per 1x32 block, FP8 static / per token
/ per 1x128 group.
"""

from __future__ import annotations

from typing import Callable

import torch

from tfcompile.kernels import formats as F
from tfcompile.kernels.formats.quantizer import WeightQuantizer

Fn = Callable[[torch.Tensor], torch.Tensor]


class _STE(torch.autograd.Function):
    """y = fn(x) in the forward pass, dy/dx = identity in the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: Fn) -> torch.Tensor:  # noqa: D401 - autograd API
        return fn(x.detach())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def ste(x: torch.Tensor, fn: Fn) -> torch.Tensor:
    """fn(x) with a straight-through gradient (fn may be any non-differentiable rounding)."""
    return _STE.apply(x, fn)


def to_storage(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """w rounded to the checkpoint dtype (what the distilled checkpoint stores), as float32."""
    if dtype == torch.float32:
        return w
    return ste(w, lambda t: t.to(dtype).float())


def quant_dequant_weight(w: torch.Tensor, weights: WeightQuantizer, gscale: torch.Tensor | None, rule: str,
                         model_dtype: torch.dtype, impl: str = "reference") -> torch.Tensor:
    """[N, K] float32 (already rounded to the model dtype) -> its dequantized artifact value."""
    q = weights.quantize(w, global_scale=gscale, rule=rule, scale_dtype=model_dtype, impl=impl)
    return F.dequantize(q, torch.float32)


def fake_quant_weight(w: torch.Tensor, weights: WeightQuantizer, gscale: torch.Tensor | None, rule: str,
                      model_dtype: torch.dtype, impl: str = "reference") -> torch.Tensor:
    """STE fake quantization of a weight [N, K] (float32, storage-rounded)."""
    return ste(w, lambda t: quant_dequant_weight(t, weights, gscale, rule, model_dtype, impl))


def group_global_scale(weights: WeightQuantizer, group: list[torch.Tensor]) -> torch.Tensor | None:
    """NVFP4: 2688 / max |w| over the fusion group (4/6: 1536 / max |w|), (1,) float32, as pack computes
    it; per-tensor FP8: the group's one weight scale (largest amax / 448); else None."""
    return weights.group_global_scale([w.detach() for w in group])


def act_fake_quant_fn(act: str | None, static_amax: float | None, module: str,
                      model_dtype: torch.dtype = torch.bfloat16, impl: str = "reference") -> Fn | None:
    """x -> dequantize(quantize(x)) for scheme activation kind `act` (None: weight-only).

    static_amax: the calibrated input amax of the Linear's fusion group (max over
    members), for the static kinds; turned into the stored scale exactly as pack writes it."""
    try:
        q = F.act_quantizer(act)
    except ValueError:
        raise ValueError(f"{module}: unknown activation scheme {act!r}") from None
    return None if q is None else q.emulate(static_amax, model_dtype, name=module, impl=impl)
