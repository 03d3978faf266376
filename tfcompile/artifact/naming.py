"""On-disk tensor names and dtypes, per scheme, for both artifact views.

compressed-tensors (vLLM, SGLang) and modelopt (TensorRT-LLM) store the same
numbers under different names and scale directions (docs/formats.md "Two views"):

| scheme  | compressed-tensors                                   | modelopt                                   |
|---------|------------------------------------------------------|--------------------------------------------|
| nvfp4   | weight_packed u8, weight_scale e4m3,                 | weight u8, weight_scale e4m3,              |
|         | weight_global_scale f32 = 2688/amax (multiplier),    | weight_scale_2 f32 = amax/2688 (divisor),  |
|         | input_global_scale f32 (W4A4)                        | input_scale f32 = 1/input_global_scale     |
| mxfp4   | weight_packed u8, weight_scale u8 (E8M0)             | weight u8, weight_scale u8 (E8M0)          |
| mxfp8   | weight e4m3, weight_scale u8 (E8M0)                  | weight e4m3, weight_scale u8 (E8M0)        |
| fp8     | weight e4m3, weight_scale (model dtype), input_scale | weight e4m3, weight_scale f32, input_scale |

The compressed-tensors side follows from the scheme's quantizers (`Scheme.weights`,
`Scheme.acts`: packing, scale dtype and shape, global scale, static input scale);
`ct_tensors` writes a QTensor under these names and `qtensor_of` reads it back.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tfcompile.ir import OutSpec
from tfcompile.kernels.formats import QTensor, global_scale_to_modelopt
from tfcompile.schemes import Scheme, get_scheme

GLOBAL_SCALE = "weight_global_scale"


class TensorSource(Protocol):
    def get(self, name: str) -> torch.Tensor: ...


def data_name(scheme: Scheme) -> str:
    """The weight data's tensor suffix in the compressed-tensors view."""
    return "weight_packed" if scheme.packed else "weight"


def ct_outputs(scheme: Scheme, module: str, n: int, k: int, model_dtype: torch.dtype) -> list[OutSpec]:
    """compressed-tensors tensors of one quantized Linear [N, K], in write order."""
    w, a, m = scheme.weights, scheme.acts, module
    out = [OutSpec(f"{m}.{data_name(scheme)}", torch.uint8 if w.packed else torch.float8_e4m3fn,
                   (n, k // 2) if w.packed else (n, k)),
           OutSpec(f"{m}.weight_scale", w.scale_dtype(model_dtype), w.scale_shape(n, k))]
    if w.shares_global_scale:
        out.append(OutSpec(f"{m}.{GLOBAL_SCALE}", torch.float32, (1,)))
    if a is not None and a.static:
        out.append(OutSpec(f"{m}.{a.scale_name}", a.scale_dtype(model_dtype), (1,)))
    return out


def ct_tensors(q: QTensor, scheme: Scheme, module: str, input_amax: float | None,
               model_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One Linear's compressed-tensors tensors from its QTensor; `input_amax`: the calibrated
    input amax of its fusion group (static-activation schemes: one input scale per group)."""
    w, a, m = scheme.weights, scheme.acts, module
    out = {f"{m}.{data_name(scheme)}": q.data, f"{m}.weight_scale": w.stored_scale(q, model_dtype)}
    if w.shares_global_scale:
        out[f"{m}.{GLOBAL_SCALE}"] = q.global_scale.reshape(1).float()
    if a is not None and a.static:
        out[f"{m}.{a.scale_name}"] = a.static_scale(input_amax, model_dtype)
    return out


def qtensor_of(tensors: TensorSource, scheme: Scheme, m: str, n: int, k: int) -> QTensor:
    """Rebuild the QTensor of Linear `m` [n, k] from its compressed-tensors tensors."""
    w = scheme.weights
    g = tensors.get(f"{m}.{GLOBAL_SCALE}") if w.shares_global_scale else None
    return w.from_stored(tensors.get(f"{m}.{data_name(scheme)}"), tensors.get(f"{m}.weight_scale"), g, (n, k))


def static_input_scale(tensors: TensorSource, scheme: Scheme, m: str) -> torch.Tensor | None:
    """The stored static input scale of Linear `m` (None: the scheme has none)."""
    a = scheme.acts
    return tensors.get(f"{m}.{a.scale_name}") if a is not None and a.static else None


def _modelopt_scale(scheme: Scheme, n: int, k: int) -> tuple[torch.dtype, tuple[int, ...]]:
    """modelopt's weight_scale: FP8 scales are float32, per tensor 0-d and per channel (N,);
    block scales (NVFP4 E4M3, MX E8M0, FP8 128x128) as compressed-tensors stores them."""
    w = scheme.weights
    if w.block_scaled:
        return w.scale_dtype(torch.float32), w.scale_shape(n, k)
    shape = {"tensor": (), "channel": (n,)}.get(w.granularity, w.scale_shape(n, k))
    return torch.float32, shape


def modelopt_outputs(scheme: Scheme, module: str, n: int, k: int) -> list[OutSpec]:
    """modelopt (TensorRT-LLM) tensors of one quantized Linear, in write order."""
    w, a, m = scheme.weights, scheme.acts, module
    dtype, shape = _modelopt_scale(scheme, n, k)
    out = [OutSpec(f"{m}.weight", torch.uint8 if w.packed else torch.float8_e4m3fn, (n, k // 2) if w.packed else (n, k)),
           OutSpec(f"{m}.weight_scale", dtype, shape)]
    if w.shares_global_scale:
        out.append(OutSpec(f"{m}.weight_scale_2", torch.float32, ()))
    if a is not None and a.static:
        out.append(OutSpec(f"{m}.input_scale", torch.float32, ()))
    return out


def to_modelopt(scheme: Scheme, module: str, ct: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename one Linear's compressed-tensors tensors to the modelopt view.

    Scale directions are converted explicitly, never guessed: modelopt's
    weight_scale_2 is the divisor amax/2688 = 1 / weight_global_scale, and its
    NVFP4 input_scale is 1 / input_global_scale.
    """
    w, a, m = scheme.weights, scheme.acts, module
    out = {f"{m}.weight": ct[f"{m}.{data_name(scheme)}"]}
    if not w.block_scaled:  # FP8's float scales: float32, per tensor 0-d, per channel (N,)
        _, shape = _modelopt_scale(scheme, *ct[f"{m}.weight"].shape)
        out[f"{m}.weight_scale"] = ct[f"{m}.weight_scale"].float().reshape(shape)
    else:  # E4M3 / E8M0 block scales travel as they are
        out[f"{m}.weight_scale"] = ct[f"{m}.weight_scale"]
    if w.shares_global_scale:
        out[f"{m}.weight_scale_2"] = global_scale_to_modelopt(ct[f"{m}.{GLOBAL_SCALE}"]).reshape(())
    if a is not None and a.static:
        s = ct[f"{m}.{a.scale_name}"].float()
        out[f"{m}.input_scale"] = (1.0 / s if a.scale_name == "input_global_scale" else s).reshape(())
    return out


def modelopt_kv_name(name: str) -> str:
    """compressed-tensors `self_attn.k_scale` -> modelopt `self_attn.k_proj.k_scale` (v likewise)."""
    attn, _, kind = name.rpartition(".")
    return f"{attn}.{kind[0]}_proj.{kind}"


def layer_scheme(layer: dict, scheme: Scheme) -> Scheme:
    """A manifest layer's scheme: its own `format` (mixed precision), else the artifact's."""
    name = layer.get("format")
    return scheme if not name or name == scheme.name else get_scheme(name)
