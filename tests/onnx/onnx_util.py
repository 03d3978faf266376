"""Helpers for the ONNX export tests: run a model, the oracle's logits, graph surgery."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import torch

BF16_REL = 2.0 ** -8  # bf16 keeps 8 significant bits: one rounding moves a value by <= 2^-8 of itself
QUANTIZE_OPS = {"QuantizeLinear", "TRT_FP4DynamicQuantize", "TRT_MXFP8DynamicQuantize", "MXFP4DynamicQuantize"}
DEQUANTIZE_OPS = {"DequantizeLinear", "TRT_MXFP8DequantizeLinear", "MXFP4DequantizeLinear"}


def feeds(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids, dtype=np.int64)}


def run_onnx(model: str | Path | onnx.ModelProto, ids: np.ndarray, outputs=None) -> tuple[list, str]:
    """Run with ONNX Runtime when its CPU kernels cover every type in the graph, else with
    onnx.reference (ORT 1.32 has no FLOAT4E2M1/FLOAT8E8M0 DequantizeLinear). -> (outputs, runtime)."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - NOT_IMPLEMENTED: a type ORT's CPU kernels lack
        if "NOT_IMPLEMENTED" not in str(e):
            raise
        ref = ReferenceEvaluator(model if isinstance(model, onnx.ModelProto) else str(model))
        return ref.run(outputs, feeds(ids)), "onnx.reference"
    return sess.run(outputs, feeds(ids)), "onnxruntime"


def oracle_logits(artifact: Path, ids: np.ndarray, activations: bool = True) -> np.ndarray:
    """tfcompile's own dequantized model (tfcompile/evaluate/models.py) in float32; with
    activations=False its activation-quantization hooks are removed (weights only)."""
    from tfcompile.evaluate.models import load_candidate

    cand = load_candidate(artifact, torch.float32)
    if not activations:
        for q in cand.linears.values():
            q.module._forward_pre_hooks.clear()
    with torch.no_grad():
        return cand.model(input_ids=torch.from_numpy(ids)).logits.numpy()


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def bypass_activation_quant(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose MatMuls read the float activation instead of its quantize -> dequantize:
    isolates the graph and the weights from activation rounding."""
    model = copy.deepcopy(model)
    prod = _producers(model)
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        dq = prod.get(node.input[0])
        q = prod.get(dq.input[0]) if dq is not None and dq.op_type in DEQUANTIZE_OPS else None
        if q is not None and q.op_type in QUANTIZE_OPS:
            node.input[0] = q.input[0]
    return model


def activation_pair(model: onnx.ModelProto, module_scope: str) -> tuple[str, str]:
    """(float input, dequantized activation) value names feeding `module_scope`'s MatMul."""
    prod = _producers(model)
    mm = next(n for n in model.graph.node if n.op_type == "MatMul" and n.name == f"{module_scope}/MatMul")
    dq = prod[mm.input[0]]
    q = prod[dq.input[0]]
    return q.input[0], mm.input[0]


def with_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    for n in names:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    return model


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| in units of max |ref| (the scale a bf16 rounding of the logits works at)."""
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def initializers(path: Path) -> dict[str, onnx.TensorProto]:
    m = onnx.load(str(path), load_external_data=False)
    return {t.name: t for t in m.graph.initializer}
