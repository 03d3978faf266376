"""Model-local ONNX functions for the quantize/dequantize steps QDQ cannot state.

Dynamic block quantization (the scale is computed from the activation) has
no single standard operator. Following modelopt's ONNX export, the graph
carries TensorRT's custom ops where TensorRT has one — its parser imports
`TRT_FP4DynamicQuantize`, `TRT_MXFP8DynamicQuantize` and
`TRT_MXFP8DequantizeLinear` (domain "trt") natively, before looking at a
local function of the same name. Each op is also defined here as a
model-local function made of standard operators (the model's opset, 23 or newer), so ONNX Runtime,
onnx.reference and any other runtime compute the same thing by inlining
it. MX with E2M1 elements has no TensorRT op; its functions live in the
"tfcompile" domain. Semantics (docs/onnx.md): blocks along the last axis;
`block_size`, `axis` (= -1) and `output_dtype` are node attributes.
"""

from __future__ import annotations

import math

import onnx
from onnx import AttributeProto, TensorProto, helper

from tfcompile.kernels.formats.mx import MX_ELEMENTS

F32 = TensorProto.FLOAT
TRT = "trt"
TFC = "tfcompile"

FP4_DYNAMIC = (TRT, "TRT_FP4DynamicQuantize")  # (x, divisor scalar) -> (E2M1 x, E4M3 block scales)
MXFP8_DYNAMIC = (TRT, "TRT_MXFP8DynamicQuantize")  # (x) -> (E4M3 x, E8M0 codes as uint8)
MXFP8_DEQUANT = (TRT, "TRT_MXFP8DequantizeLinear")  # (E4M3 x, E8M0 codes) -> float
MXFP4_DYNAMIC = (TFC, "MXFP4DynamicQuantize")  # (x) -> (E2M1 x, E8M0 codes as uint8)
MXFP4_DEQUANT = (TFC, "MXFP4DequantizeLinear")  # (E2M1 x, E8M0 codes) -> float


class _Body:
    """Nodes of one function body; values are named v0, v1, ..."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []

    def __call__(self, op: str, *inputs: str, refs: tuple[str, ...] = (), out: str | None = None,
                 **attrs) -> str:
        """Append `op(inputs)`; `refs` names int attributes taken from the calling node
        ("attr" or "attr=parent_attr")."""
        name = out or f"v{len(self.nodes)}"
        node = helper.make_node(op, list(inputs), [name], **attrs)
        for ref in refs:
            attr, _, parent = ref.partition("=")
            node.attribute.append(helper.make_attribute_ref(attr, AttributeProto.INT, ref_attr_name=parent or attr))
        self.nodes.append(node)
        return name

    def f(self, value: float) -> str:
        return self("Constant", value_float=float(value))

    def ints(self, *values: int) -> str:
        return self("Constant", value_ints=list(values))

    def blocks_amax(self, x: str) -> tuple[str, str]:
        """x [..., K] -> (xb [..., K/bs, bs], amax [..., K/bs]); bs is the node's block_size."""
        bs = self("Constant", refs=("value_int=block_size",))
        bs1 = self("Unsqueeze", bs, self.ints(0))
        lead = self("Shape", x, end=-1)
        xb = self("Reshape", x, self("Concat", lead, self.ints(-1), bs1, axis=0))
        amax = self("ReduceMax", self("Abs", xb), self.ints(-1), keepdims=0)
        return xb, amax


def _function(key: tuple[str, str], inputs, outputs, body: _Body, attributes, doc: str,
              opset: int) -> onnx.FunctionProto:
    """A FunctionProto importing the model's own default-domain opset (ONNX requires them equal)."""
    fn = helper.make_function(key[0], key[1], inputs, outputs, body.nodes,
                              [helper.make_opsetid("", opset)], attributes=attributes)
    fn.doc_string = doc
    return fn


def fp4_dynamic_quantize(opset: int) -> onnx.FunctionProto:
    """TRT_FP4DynamicQuantize(x [..., K], d) -> (x_f4 [..., K] E2M1, sx_f8 [..., K/16] E4M3).

    d is the per-tensor divisor (modelopt `input_scale` = amax/2688). Per block:
    sx = e4m3(amax_b / 6 / d) (saturating RNE; 0 -> 1.0), x_f4 = e2m1(x / (sx * d)).
    The caller dequantizes with DequantizeLinear(sx_f8, d) then DequantizeLinear(x_f4, .)."""
    b = _Body()
    _, amax = b.blocks_amax("x")
    sx = b("Cast", b("Div", b("Div", amax, b.f(6.0)), "scale"), to=TensorProto.FLOAT8E4M3FN, saturate=1)
    sxf = b("Cast", sx, to=F32)
    one = b("Where", b("Equal", sxf, b.f(0.0)), b.f(1.0), sxf)  # an all-zero block: scale 1.0
    b("Cast", one, to=TensorProto.FLOAT8E4M3FN, out="sx_f8")
    eff = b("Mul", one, "scale")  # = DequantizeLinear(sx_f8, d), the per-block dequant multiplier
    b("QuantizeLinear", "x", eff, axis=-1, output_dtype=TensorProto.FLOAT4E2M1,
      refs=("block_size",), out="x_f4")
    return _function(FP4_DYNAMIC, ["x", "scale"], ["x_f4", "sx_f8"], b, ["axis", "block_size", "scale_type"],
                     fp4_dynamic_quantize.__doc__, opset)


def mx_dynamic_quantize(elem: str, rule: str, opset: int) -> onnx.FunctionProto:
    """MX dynamic quantize: (x [..., K]) -> (x_q [..., K], codes uint8 [..., K/bs]).

    Shared exponent per block, exact (tfcompile.kernels.formats.mx_shared_exponent):
    floor: e = floor(log2 amax) - emax_elem; ceil (RCEIL): one more when amax > top * 2^floor;
    clamped to [-127, 127], 0 for an all-zero block; code = e + 127; x_q = elem(x / 2^e)."""
    emax, top = MX_ELEMENTS[elem]  # the format's (kernels/formats/mx.py)
    b = _Body()
    _, amax = b.blocks_amax("x")
    pos = b("Greater", amax, b.f(0.0))
    safe = b("Where", pos, amax, b.f(1.0))
    two = b.f(2.0)
    e0 = b("Floor", b("Div", b("Log", safe), b.f(math.log(2.0))))  # floor(log2), maybe off by one
    p = b("Pow", two, e0)
    fix_down = b("Cast", b("Greater", p, safe), to=F32)  # 2^e0 > amax: e0 was one too high
    fix_up = b("Cast", b("LessOrEqual", b("Mul", p, two), safe), to=F32)  # 2^(e0+1) <= amax: too low
    fl = b("Add", b("Sub", e0, fix_down), fix_up)  # exact floor(log2 amax)
    e = b("Sub", fl, b.f(emax))
    if rule == "ceil":
        over = b("Greater", safe, b("Mul", b.f(top), b("Pow", two, fl)))
        e = b("Add", e, b("Cast", over, to=F32))
    e = b("Clip", b("Where", pos, e, b.f(0.0)), b.f(-127.0), b.f(127.0))
    b("Cast", b("Add", e, b.f(127.0)), to=TensorProto.UINT8, out="scale")
    b("QuantizeLinear", "x", b("Pow", two, e), axis=-1, saturate=1,
      refs=("block_size", "output_dtype"), out="y")
    key = MXFP4_DYNAMIC if elem == "fp4" else MXFP8_DYNAMIC
    return _function(key, ["x"], ["y", "scale"], b, ["axis", "block_size", "output_dtype"],
                     mx_dynamic_quantize.__doc__ + f" Here: {elem} elements, {rule} rule.", opset)


def mx_dequantize(elem: str, opset: int) -> onnx.FunctionProto:
    """MX dequantize: (x_q [..., K], codes uint8 [..., K/bs]) -> x_q * 2^(code - 127), blocks along `axis`."""
    b = _Body()
    scale = b("Pow", b.f(2.0), b("Sub", b("Cast", "scale", to=F32), b.f(127.0)))
    b("DequantizeLinear", "x", scale, out="y",
      refs=("axis", "block_size", "output_dtype"))
    key = MXFP4_DEQUANT if elem == "fp4" else MXFP8_DEQUANT
    return _function(key, ["x", "scale"], ["y"], b, ["axis", "block_size", "output_dtype"],
                     mx_dequantize.__doc__, opset)
