"""QuantLinear: one quantized Linear of an artifact, run by its kernels or their emulation.

It holds the tensors exactly as the artifact stores them (buffers, so
`.to(device)` moves them) and computes y = act(x) @ dequantize(W)^T (+ bias), with
the kernels `Kernels` names:

- "emulated" (any device, the CPU path): activations quantize -> dequantize as
  the scheme says (the scheme's activation quantizer, the same one `tfcompile
  eval` emulates), weights decoded once by tfcompile.kernels.formats.dequantize
  (fp32, cached per dtype), then torch's matmul in x's dtype. This equals the
  reference dequantized nn.Linear bit for bit.
- "triton": the artifact's cubins launched through Triton's driver
  (runtime/cuda.py) for the bucket of M = x.shape[:-1].numel().
- "cutlass": the artifact's CUTLASS shared objects (runtime/cutlass.py), after the
  Triton activation-quantization kernel.
"""

from __future__ import annotations

import enum

import torch
from torch import nn
from torch.nn import functional as F

from tfcompile.evaluate.actquant import act_quantizer
from tfcompile.kernels.formats import QTensor, dequantize


class Kernels(str, enum.Enum):
    """Which kernels run an artifact's Linears: the one vocabulary of `load_artifact(kernels=)`,
    `LoadedArtifact.kernels` and `QuantLinear.kernels`."""
    AUTO = "auto"  # the artifact's Triton kernels on a CUDA device of one of its targets, else emulated
    TRITON = "triton"  # the artifact's Triton cubins (kernels/<target>/)
    CUTLASS = "cutlass"  # the artifact's CUTLASS shared objects (kernels/<target>/cutlass/)
    EMULATED = "emulated"  # the torch emulation, on any device

    def __str__(self) -> str:
        return self.value


class QuantLinear(nn.Module):
    def __init__(self, name: str, q: QTensor, act_kind: str | None = None,
                 static_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        self.name = name
        self.out_features, self.in_features = q.shape
        self.format, self.granularity, self.block, self.rule = q.format, q.granularity, q.block, q.rule
        self.register_buffer("data", q.data)
        self.register_buffer("scale", q.scale)
        self.register_buffer("global_scale", q.global_scale)
        self.register_buffer("static_scale", static_scale)  # input_scale / input_global_scale, or None
        self.register_buffer("bias", bias)
        self.act_kind = act_kind  # Scheme.act: how activations are quantized (None: weight-only)
        self._act = None  # (device, x -> quantize-dequantize(x)), built for the scales' device
        self.kernels = Kernels.EMULATED  # what forward runs (TRITON / CUTLASS once attached)
        self.runner = None  # runtime.cuda.LinearRunner (triton) / runtime.cutlass.CutlassRunner (cutlass)
        self._w: dict[torch.dtype, torch.Tensor] = {}

    @property
    def qtensor(self) -> QTensor:
        return QTensor(self.format, self.data, self.scale, self.global_scale,
                       (self.out_features, self.in_features), self.granularity, self.rule, self.block)

    @property
    def act(self):
        """The activation emulation (tfcompile.evaluate.actquant), on the static scale's device."""
        if self.act_kind is None:
            return None
        dev = None if self.static_scale is None else self.static_scale.device
        if self._act is None or self._act[0] != dev:
            self._act = (dev, act_quantizer(self.act_kind, self.name, self.static_scale))
        return self._act[1]

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [N, K] decoded in fp32, then cast once to `dtype` (cached)."""
        w = self._w.get(dtype)
        if w is None or w.device != self.data.device:
            w = self._w[dtype] = dequantize(self.qtensor, torch.float32).to(dtype)
        return w

    def _apply(self, fn, *args, **kwargs):
        self._w.clear()  # moved or cast: decode again on the new device
        self._act = None
        return super()._apply(fn, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels != Kernels.EMULATED and x.is_cuda:
            return self.runner(x)
        return self.emulated(x)

    def emulated(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is not None and x.numel():
            x = self.act(x)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}, "
                f"kernels={self.kernels}")
