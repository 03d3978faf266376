"""A small ONNX graph builder: nodes, named values, constants, initializers.

`Graph.op` appends a node and returns its output name(s); names are scoped
like torch.onnx's (`/model/layers.0/self_attn/q_proj/MatMul`) so a TensorRT
or Netron user can find a layer. Initializers come from a TensorSink
(streamed artifact bytes); `const` makes small constants (shapes, eps).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tfcompile.onnx_export.writer import TensorSink

F32 = TensorProto.FLOAT


class Graph:
    def __init__(self, sink: TensorSink, opset: int):
        self.sink = sink
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.functions: dict[tuple[str, str], onnx.FunctionProto] = {}  # (domain, name) -> local function
        self.domains: set[str] = set()
        self._scope: list[str] = []
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}

    @contextmanager
    def scope(self, name: str, absolute: bool = False):
        """Prefix node names with `name` (appended to the current scope, or replacing it)."""
        saved = self._scope
        self._scope = ([] if absolute else saved) + [name]
        try:
            yield
        finally:
            self._scope = saved

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, domain: str = "", name: str | None = None,
           out: str | None = None, **attrs) -> str | list[str]:
        """Append `op_type(inputs)`; returns the output name (`out` if given), or the list of
        names if outputs > 1."""
        node_name = self._unique("/" + "/".join(self._scope + [name or op_type]))
        outs = [out] if out else [f"{node_name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, domain=domain, **attrs))
        if domain:
            self.domains.add(domain)
        return outs[0] if outputs == 1 else outs

    def const(self, value, dtype=np.float32) -> str:
        """A small constant initializer (scalar or 1-D); identical values are shared."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self._unique(f"const_{len(self._consts)}")
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def ints(self, *values: int) -> str:
        """A 1-D int64 constant (shapes, axes)."""
        return self.const(list(values), np.int64)

    def fp8_zero(self, n: int | None = None) -> str:
        """A FLOAT8E4M3FN zero point (scalar, or [n] for a per-axis scale): its type makes
        QuantizeLinear produce E4M3, the form modelopt's FP8 exports give TensorRT."""
        key = ("fp8_zero", n)
        if key not in self._consts:
            name = self._unique(f"fp8_zero_{n or 0}")
            dims = [] if n is None else [n]
            self.initializers.append(helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, dims, b"\0" * (n or 1),
                                                        raw=True))
            self._consts[key] = name
        return self._consts[key]

    def initializer(self, name: str, elem_type: int, dims, tensor) -> str:
        """An initializer holding the bytes of the torch tensor `tensor` (streamed by the sink)."""
        self._names.add(name)
        self.initializers.append(self.sink.add(name, elem_type, list(dims), tensor))
        return name

    def small(self, name: str, array: np.ndarray) -> str:
        """A small derived initializer (an fp32 scale) under a chosen name."""
        self._names.add(name)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))  # 0-d stays 0-d
        return name

    def add_function(self, fn: onnx.FunctionProto) -> None:
        self.functions.setdefault((fn.domain, fn.name), fn)
        self.domains.add(fn.domain)
