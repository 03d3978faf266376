"""ONNX export of tfcompile artifacts: weights stay in their quantized types and feed
DequantizeLinear; activation quantization is QDQ or TensorRT's dynamic-quantize ops
(with ONNX-function bodies so any runtime can run them). docs/onnx.md."""

from tfcompile.onnx_export.config import DEFAULT_OPSET, OnnxExportConfig, OnnxExportError
from tfcompile.onnx_export.export import ExportResult, data_name, export_onnx, export_to_path
from tfcompile.onnx_export.source import ArtifactView, check_exportable, view_from_path

__all__ = ["DEFAULT_OPSET", "OnnxExportConfig", "OnnxExportError", "ExportResult", "ArtifactView",
           "check_exportable", "data_name", "export_onnx", "export_to_path", "view_from_path"]
