"""ONNX export of tfcompile artifacts: weights stay in their quantized types and feed
DequantizeLinear; activation quantization is QDQ or TensorRT's dynamic-quantize ops
(with ONNX-function bodies so any runtime can run them). docs/onnx.md.

The names below load on first use (PEP 562 `__getattr__`): the `onnx` pass's settings
(config.py) are read on every run, and export.py imports onnx (~1 s), which only an export needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"DEFAULT_OPSET": "config", "OnnxExportConfig": "config", "OnnxExportError": "config",
            "ExportResult": "export", "data_name": "export", "export_onnx": "export", "export_to_path": "export",
            "ArtifactView": "source", "check_exportable": "source", "view_from_path": "source"}

__all__ = ["DEFAULT_OPSET", "OnnxExportConfig", "OnnxExportError", "ExportResult", "ArtifactView",
           "check_exportable", "data_name", "export_onnx", "export_to_path", "view_from_path"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
