"""On-disk tensor names and dtypes, per scheme, for both artifact views.

compressed-tensors (vLLM, SGLang) and modelopt (TensorRT-LLM) store the same
numbers under different names and scale directions (REFERENCE.md §4):

| scheme  | compressed-tensors                                   | modelopt                                   |
|---------|------------------------------------------------------|--------------------------------------------|
| nvfp4   | weight_packed u8, weight_scale e4m3,                 | weight u8, weight_scale e4m3,              |
|         | weight_global_scale f32 = 2688/amax (multiplier),    | weight_scale_2 f32 = amax/2688 (divisor),  |
|         | input_global_scale f32 (W4A4)                        | input_scale f32 = 1/input_global_scale     |
| mxfp4   | weight_packed u8, weight_scale u8 (E8M0)             | weight u8, weight_scale u8 (E8M0)          |
| mxfp8   | weight e4m3, weight_scale u8 (E8M0)                  | weight e4m3, weight_scale u8 (E8M0)        |
| fp8     | weight e4m3, weight_scale (model dtype), input_scale | weight e4m3, weight_scale f32, input_scale |
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcompile.schemes import Scheme


@dataclass(frozen=True)
class OutSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def fp8_scale_shape(scheme: Scheme, n: int, k: int) -> tuple[int, ...]:
    if scheme.granularity == "tensor":
        return (1,)
    if scheme.granularity == "channel":
        return (n, 1)
    bn, bk = scheme.block
    return (-(-n // bn), -(-k // bk))


def ct_outputs(scheme: Scheme, module: str, n: int, k: int, model_dtype: torch.dtype) -> list[OutSpec]:
    """compressed-tensors tensors of one quantized Linear [N, K], in write order."""
    m = module
    if scheme.weight == "nvfp4":
        out = [OutSpec(f"{m}.weight_packed", torch.uint8, (n, k // 2)),
               OutSpec(f"{m}.weight_scale", torch.float8_e4m3fn, (n, k // 16)),
               OutSpec(f"{m}.weight_global_scale", torch.float32, (1,))]
        if scheme.act_static:
            out.append(OutSpec(f"{m}.input_global_scale", torch.float32, (1,)))
        return out
    if scheme.weight == "mxfp4":
        return [OutSpec(f"{m}.weight_packed", torch.uint8, (n, k // 2)),
                OutSpec(f"{m}.weight_scale", torch.uint8, (n, k // 32))]
    if scheme.weight == "mxfp8":
        return [OutSpec(f"{m}.weight", torch.float8_e4m3fn, (n, k)),
                OutSpec(f"{m}.weight_scale", torch.uint8, (n, k // 32))]
    out = [OutSpec(f"{m}.weight", torch.float8_e4m3fn, (n, k)),
           OutSpec(f"{m}.weight_scale", model_dtype, fp8_scale_shape(scheme, n, k))]
    if scheme.act_static:
        out.append(OutSpec(f"{m}.input_scale", model_dtype, (1,)))
    return out


def modelopt_outputs(scheme: Scheme, module: str, n: int, k: int) -> list[OutSpec]:
    """modelopt (TensorRT-LLM) tensors of one quantized Linear, in write order."""
    m = module
    if scheme.weight == "nvfp4":
        out = [OutSpec(f"{m}.weight", torch.uint8, (n, k // 2)),
               OutSpec(f"{m}.weight_scale", torch.float8_e4m3fn, (n, k // 16)),
               OutSpec(f"{m}.weight_scale_2", torch.float32, ())]
        if scheme.act_static:
            out.append(OutSpec(f"{m}.input_scale", torch.float32, ()))
        return out
    if scheme.weight == "mxfp4":
        return [OutSpec(f"{m}.weight", torch.uint8, (n, k // 2)),
                OutSpec(f"{m}.weight_scale", torch.uint8, (n, k // 32))]
    if scheme.weight == "mxfp8":
        return [OutSpec(f"{m}.weight", torch.float8_e4m3fn, (n, k)),
                OutSpec(f"{m}.weight_scale", torch.uint8, (n, k // 32))]
    if scheme.granularity == "tensor":
        shape: tuple[int, ...] = ()  # modelopt: 0-d per-tensor scale
    elif scheme.granularity == "channel":
        shape = (n,)  # modelopt: (N,) per-channel scale
    else:
        shape = fp8_scale_shape(scheme, n, k)
    out = [OutSpec(f"{m}.weight", torch.float8_e4m3fn, (n, k)),
           OutSpec(f"{m}.weight_scale", torch.float32, shape)]
    if scheme.act_static:
        out.append(OutSpec(f"{m}.input_scale", torch.float32, ()))
    return out


def to_modelopt(scheme: Scheme, module: str, ct: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename one Linear's compressed-tensors tensors to the modelopt view.

    Scale directions are converted explicitly, never guessed: modelopt's
    weight_scale_2 is the divisor amax/2688 = 1 / weight_global_scale.
    """
    m, out = module, {}
    if scheme.weight == "nvfp4":
        from tfcompile.kernels.formats import global_scale_to_modelopt

        out[f"{m}.weight"] = ct[f"{m}.weight_packed"]
        out[f"{m}.weight_scale"] = ct[f"{m}.weight_scale"]
        out[f"{m}.weight_scale_2"] = global_scale_to_modelopt(ct[f"{m}.weight_global_scale"]).reshape(())
        if scheme.act_static:
            out[f"{m}.input_scale"] = (1.0 / ct[f"{m}.input_global_scale"].float()).reshape(())
        return out
    if scheme.weight == "mxfp8":  # E8M0 scales travel as they are
        return {f"{m}.weight": ct[f"{m}.weight"], f"{m}.weight_scale": ct[f"{m}.weight_scale"]}
    if scheme.packed:
        out[f"{m}.weight"] = ct[f"{m}.weight_packed"]
        out[f"{m}.weight_scale"] = ct[f"{m}.weight_scale"]
        return out
    out[f"{m}.weight"] = ct[f"{m}.weight"]
    ws = ct[f"{m}.weight_scale"].float()
    if scheme.granularity == "tensor":
        ws = ws.reshape(())  # modelopt stores per-tensor scales as 0-d
    elif scheme.granularity == "channel":
        ws = ws.reshape(-1)  # and per-channel scales as (N,)
    out[f"{m}.weight_scale"] = ws
    if scheme.act_static:
        out[f"{m}.input_scale"] = ct[f"{m}.input_scale"].float().reshape(())
    return out


def modelopt_kv_name(name: str) -> str:
    """compressed-tensors `self_attn.k_scale` -> modelopt `self_attn.k_proj.k_scale` (v likewise)."""
    attn, _, kind = name.rpartition(".")
    return f"{attn}.{kind[0]}_proj.{kind}"
