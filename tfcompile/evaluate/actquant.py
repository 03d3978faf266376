"""Activation quantization as an engine applies it, emulated in float.

Each function maps a Linear's input x to quantize -> dequantize(x) in x's
dtype, using tfcompile.kernels.formats' activation quantizers (the same
reference the weights were encoded with). Per scheme (`Scheme.act`):

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

from tfcompile.kernels.formats import (dequantize, dequantize_fp8_act, quantize_fp8_act,
                                       quantize_mx_act, quantize_nvfp4_act)

ActFn = Callable[[torch.Tensor], torch.Tensor]

# act kind -> the artifact tensor suffix holding its static scale (if any)
STATIC_SCALE = {"nvfp4": "input_global_scale", "fp8-static": "input_scale"}


def act_quantizer(act: str | None, module: str, static_scale: torch.Tensor | None = None) -> ActFn | None:
    """The emulation for scheme activation kind `act` (None: weight-only, no emulation)."""
    if act is None:
        return None
    if act in STATIC_SCALE and static_scale is None:
        raise ValueError(f"{module}: activation scheme {act} needs its {STATIC_SCALE[act]}")
    if act == "nvfp4":
        g = static_scale.detach().float().reshape(1).clone()
        return lambda x: dequantize(quantize_nvfp4_act(x, g.to(x.device), name=module)).to(x.dtype)
    if act in ("mxfp4", "mxfp8"):
        elem = act[2:]
        return lambda x: dequantize(quantize_mx_act(x, elem, name=module)).to(x.dtype)
    if act == "fp8-static":
        s = static_scale.detach().float().reshape(1).clone()
        return lambda x: _fp8(x, "static", s.to(x.device), module)
    if act == "fp8-token":
        return lambda x: _fp8(x, "per_token", None, module)
    if act == "fp8-group128":
        return lambda x: _fp8(x, "per_group", None, module)
    raise ValueError(f"{module}: unknown activation scheme {act!r}")


def _fp8(x: torch.Tensor, mode: str, scale: torch.Tensor | None, module: str) -> torch.Tensor:
    data, s = quantize_fp8_act(x, mode, scale=scale, group=128, name=module)
    return dequantize_fp8_act(data, s, group=128, dtype=x.dtype)


def pre_hook(fn: ActFn):
    """A forward pre-hook replacing a module's first positional input by fn(input)."""

    def hook(_mod, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].numel():
            return (fn(args[0]), *args[1:])
        return None

    return hook
