"""One Linear y = x W^T as ONNX nodes, with the weight in its quantized type.

Weights [N, K] are initializers holding the artifact's bytes and feed
DequantizeLinear (blocks along K, axis -1); the float weight goes through
Transpose into MatMul (the DQ -> Transpose -> MatMul pattern TensorRT fuses
into a low-precision GEMM, as in modelopt's exports). Per format:

| format | weight initializers (artifact tensor -> ONNX type)                 | dequantize                          |
|--------|---------------------------------------------------------------------|-------------------------------------|
| fp8    | weight e4m3 [N,K] -> FLOAT8E4M3FN; weight_scale -> FLOAT [] or [N]   | DQ(w, s) (per tensor / axis 0)      |
| nvfp4  | weight_packed u8 [N,K/2] -> FLOAT4E2M1 [N,K]; weight_scale e4m3 [N,K/16]; weight_scale_2 = 1/weight_global_scale FLOAT [] | DQ(DQ(s_b, s_2), block 16) |
| mx*    | weight(_packed) -> FLOAT8E4M3FN / FLOAT4E2M1 [N,K]; weight_scale u8 [N,K/32] -> UINT8 (opset 23) or FLOAT8E8M0 (24+) | local MX DQ function / DQ(block 32) |

Activations (`Scheme.act`): static FP8 -> QuantizeLinear/DequantizeLinear
with the calibrated input_scale; dynamic per-token FP8 -> the scale computed
in the graph (ReduceMax) feeding standard Q/DQ with block_size K; NVFP4 ->
TRT_FP4DynamicQuantize + two DequantizeLinear; MX -> the MX functions
(functions.py). Scales the artifact keeps in the model dtype are widened to
FLOAT (exact); compressed-tensors' NVFP4 multipliers g become modelopt's
divisors 1/g (what DequantizeLinear multiplies by).
"""

from __future__ import annotations

import re

import numpy as np
import torch
from onnx import TensorProto

from tfcompile.kernels.formats import DEFAULT_MX_RULE, DEFAULT_MXFP8_RULE, global_scale_to_modelopt
from tfcompile.kernels.formats.quantizer import FP8Acts, MXActs, NVFP4Acts
from tfcompile.onnx_export import functions as fns
from tfcompile.onnx_export.config import E8M0_OPSET
from tfcompile.onnx_export.graph import F32, Graph
from tfcompile.onnx_export.writer import onnx_type
from tfcompile.schemes import Scheme

E4M3, E2M1, E8M0 = TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E8M0


def _f32(t: torch.Tensor, shape: tuple[int, ...]) -> np.ndarray:
    """A stored scale widened to float32 (bf16/fp16 -> fp32 is exact) with an ONNX-friendly shape."""
    return t.detach().float().reshape(shape).numpy()


def plain_weight(g: Graph, ckpt, name: str) -> str:
    """A non-quantized weight as stored (bf16/fp16/fp32), cast to FLOAT in the graph."""
    t = ckpt.get(name)
    w = g.initializer(name, onnx_type(t.dtype), t.shape, t)
    return w if t.dtype == torch.float32 else g.op("Cast", [w], to=F32)


def weight(g: Graph, ckpt, scheme: Scheme, m: str, n: int, k: int) -> str:
    """The dequantized weight of Linear `m`: FLOAT [N, K], by what the weight format states
    (kernels/formats/quantizer.py): per-tensor/channel FP8, two-level NVFP4 (it shares a global
    scale), or MX (E8M0 block scales)."""
    wq = scheme.weights
    if not wq.block_scaled:
        w = g.initializer(f"{m}.weight", E4M3, (n, k), ckpt.get(f"{m}.weight"))
        s = ckpt.get(f"{m}.weight_scale")
        if scheme.granularity == "tensor":
            return g.op("DequantizeLinear", [w, g.small(f"{m}.weight_scale", _f32(s, ()))])
        return g.op("DequantizeLinear", [w, g.small(f"{m}.weight_scale", _f32(s, (n,)))], axis=0)
    vec = wq.block[0]  # elements per scale along K
    elem = E2M1 if wq.element == "e2m1" else E4M3
    data = f"{m}.weight_packed" if wq.packed else f"{m}.weight"
    w = g.initializer(data, elem, (n, k), ckpt.get(data))
    if wq.shares_global_scale:  # NVFP4: E4M3 block scales times the per-tensor 1/global scale
        sb = g.initializer(f"{m}.weight_scale", E4M3, (n, k // vec), ckpt.get(f"{m}.weight_scale"))
        ws2 = global_scale_to_modelopt(ckpt.get(f"{m}.weight_global_scale"))  # 1/g: the divisor
        s = g.op("DequantizeLinear", [sb, g.small(f"{m}.weight_scale_2", _f32(ws2, ()))], name="DequantizeLinear_scale")
        return g.op("DequantizeLinear", [w, s], axis=-1, block_size=vec)
    codes = ckpt.get(f"{m}.weight_scale")  # uint8 E8M0 codes [N, K/vec]
    if g.opset >= E8M0_OPSET:
        s = g.initializer(f"{m}.weight_scale", E8M0, (n, k // vec), codes)
        return g.op("DequantizeLinear", [w, s], axis=-1, block_size=vec, output_dtype=F32)
    s = g.initializer(f"{m}.weight_scale", TensorProto.UINT8, (n, k // vec), codes)
    return _mx_dequant(g, "fp4" if wq.element == "e2m1" else "fp8", w, s)


def _mx_dequant(g: Graph, elem: str, x: str, codes: str) -> str:
    fn = fns.mx_dequantize(elem, g.opset)
    g.add_function(fn)
    return g.op(fn.name, [x, codes], domain=fn.domain, axis=-1, block_size=32, output_dtype=F32)


def activation(g: Graph, ckpt, scheme: Scheme, m: str, x: str, k: int) -> str:
    """x [..., K] after the scheme's activation quantize -> dequantize (unchanged for weight-only)."""
    act = scheme.acts  # kernels/formats ActQuantizer: the builder follows its kind, not its name
    if act is None:
        return x
    if isinstance(act, FP8Acts) and act.mode == "static":
        s = g.small(f"{m}.input_scale", _f32(ckpt.get(f"{m}.input_scale"), ()))
        q = g.op("QuantizeLinear", [x, s, g.fp8_zero()], saturate=1)
        return g.op("DequantizeLinear", [q, s])
    if isinstance(act, FP8Acts) and act.mode == "per_token":
        return _fp8_per_token(g, x, k)
    if isinstance(act, NVFP4Acts):
        d = g.small(f"{m}.input_scale", _f32(global_scale_to_modelopt(ckpt.get(f"{m}.input_global_scale")), ()))
        fn = fns.fp4_dynamic_quantize(g.opset)
        g.add_function(fn)
        xq, sx = g.op(fn.name, [x, d], outputs=2, domain=fn.domain, axis=-1, block_size=16, scale_type=E4M3)
        s = g.op("DequantizeLinear", [sx, d], name="DequantizeLinear_scale")
        return g.op("DequantizeLinear", [xq, s], axis=-1, block_size=16)
    if isinstance(act, MXActs):
        elem = act.elem  # "fp4" | "fp8"
        fn = fns.mx_dynamic_quantize(elem, DEFAULT_MX_RULE if elem == "fp4" else DEFAULT_MXFP8_RULE, g.opset)
        g.add_function(fn)
        xq, codes = g.op(fn.name, [x], outputs=2, domain=fn.domain, axis=-1, block_size=32,
                         output_dtype=E2M1 if elem == "fp4" else E4M3)
        return _mx_dequant(g, elem, xq, codes)
    raise AssertionError(f"activation scheme {scheme.act!r} reached the graph builder")  # rejected by check_scheme


def _fp8_per_token(g: Graph, x: str, k: int) -> str:
    """Dynamic per-token FP8: s = max|x| / 448 over K (0 -> 1), Q/DQ with one block of K per token."""
    amax = g.op("ReduceMax", [g.op("Abs", [x]), g.ints(-1)], keepdims=1)  # [..., 1]
    s = g.op("Div", [amax, g.const(448.0)])
    s = g.op("Where", [g.op("Equal", [s, g.const(0.0)]), g.const(1.0), s])
    q = g.op("QuantizeLinear", [x, s], axis=-1, block_size=k, output_dtype=E4M3, saturate=1)
    return g.op("DequantizeLinear", [q, s], axis=-1, block_size=k)


def _scope_of(module: str) -> str:
    """model.layers.0.self_attn.q_proj -> model/layers.0/self_attn/q_proj (torch.onnx's naming)."""
    return re.sub(r"\.(?!\d)", "/", module)


def linear(g: Graph, ckpt, scheme: Scheme | None, m: str, x: str, shape: tuple[int, int] | None) -> str:
    """y = x W^T (+ bias) for Linear `m`; `shape` (N, K) when it is quantized, None when kept as stored."""
    with g.scope(_scope_of(m), absolute=True):
        if shape is None:
            w = plain_weight(g, ckpt, f"{m}.weight")
        else:
            x = activation(g, ckpt, scheme, m, x, shape[1])
            w = weight(g, ckpt, scheme, m, *shape)
        y = g.op("MatMul", [x, g.op("Transpose", [w], perm=[1, 0])])
        if ckpt.has(f"{m}.bias"):
            y = g.op("Add", [y, plain_weight(g, ckpt, f"{m}.bias")])
    return y
