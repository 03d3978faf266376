"""Activation quantization as an engine applies it, emulated in float.

Each function maps a Linear's input x to quantize -> dequantize(x) in x's dtype, with the
scheme's activation quantizer (`Scheme.acts`, tfcompile.kernels.formats.quantizer: the same
one the quantize pass and distillation use). Per scheme (`Scheme.act`):

| act          | emulation                                                  |
|--------------|------------------------------------------------------------|
| nvfp4        | NVFP4 blocks of 16, the artifact's static input_global_scale |
| mxfp4/mxfp8  | dynamic MX blocks of 32 (E8M0), the format's default rule  |
| fp8-static   | FP8 E4M3 with the artifact's per-tensor input_scale        |
| fp8-token    | FP8 E4M3, dynamic per token                                |
| fp8-group128 | FP8 E4M3, dynamic per 1x128 group                          |
| None (*a16)  | none                                                       |
"""

from __future__ import annotations

from typing import Callable

import torch

from tfcompile.kernels.formats import act_quantizer as _quantizer

ActFn = Callable[[torch.Tensor], torch.Tensor]


def act_quantizer(act: str | None, module: str, static_scale: torch.Tensor | None = None) -> ActFn | None:
    """The emulation for scheme activation kind `act` (None: weight-only, no emulation);
    `static_scale`: the artifact's stored input scale (static kinds)."""
    try:
        q = _quantizer(act)
    except ValueError:
        raise ValueError(f"{module}: unknown activation scheme {act!r}") from None
    if q is None:
        return None
    if q.static and static_scale is None:
        raise ValueError(f"{module}: activation scheme {act} needs its {q.scale_name}")
    scale = static_scale.detach().clone() if static_scale is not None else None
    return lambda x: q.fake_quant(x, scale, name=module)


def pre_hook(fn: ActFn):
    """A forward pre-hook replacing a module's first positional input by fn(input)."""

    def hook(_mod, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].numel():
            return (fn(args[0]), *args[1:])
        return None

    return hook
