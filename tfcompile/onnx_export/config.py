"""Settings of an ONNX export and the error it raises (docs/onnx.md).

The opset decides how scales are typed: FLOAT4E2M1 and DequantizeLinear's
`output_dtype` need opset 23 (ONNX 1.18); FLOAT8E8M0 as a DequantizeLinear
scale needs opset 24 (ONNX 1.19). Below 24, MX scales stay UINT8 (the E8M0
code bytes as stored) and a local function rebuilds 2^(code - 127).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.errors import UserError

DEFAULT_OPSET = 23  # FLOAT4E2M1 + DequantizeLinear output_dtype; what TensorRT 10 parses for FP4
MIN_OPSET_FP8 = 21  # QuantizeLinear/DequantizeLinear `block_size` (FP8 per-token blocks)
MIN_OPSET_FP4 = 23  # FLOAT4E2M1 elements
E8M0_OPSET = 24  # FLOAT8E8M0 accepted as a DequantizeLinear scale
EXTERNAL_MODES = ("auto", "always", "never")
# protobuf refuses messages of 2 GiB or more; keep 128 MiB for the graph itself
INLINE_LIMIT = 2**31 - 2**27


class OnnxExportError(UserError):
    """The artifact cannot be expressed as the requested ONNX graph (exit 1)."""


@dataclass(frozen=True)
class OnnxExportConfig:
    opset: int = DEFAULT_OPSET  # default-domain opset of the graph
    external_data: str = "auto"  # auto: external above INLINE_LIMIT bytes of initializers; always; never
    inline_limit: int = INLINE_LIMIT  # bytes: the "auto" threshold (tests lower it)

    def check(self) -> None:
        newest = max_opset()
        if not isinstance(self.opset, int) or not MIN_OPSET_FP8 <= self.opset <= newest:
            raise OnnxExportError(f"opset {self.opset!r} is not supported",
                                  hint=f"choose an opset from {MIN_OPSET_FP8} to {newest} "
                                       f"(default {DEFAULT_OPSET}; FP4 formats need >= {MIN_OPSET_FP4})")
        if self.external_data not in EXTERNAL_MODES:
            raise OnnxExportError(f"external_data {self.external_data!r} is not one of {EXTERNAL_MODES}",
                                  hint="auto (external above ~1.9 GiB of weights), always or never")


def max_opset() -> int:
    """The newest opset the installed onnx knows (asked when a config is checked, not at import:
    the pass registry reads this module whenever tfcompile runs, and onnx takes ~1 s to import)."""
    import onnx  # lazy: ~1 s to import; only when an ONNX export is configured

    return onnx.defs.onnx_opset_version()
