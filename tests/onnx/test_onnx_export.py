"""`tfcompile export-onnx`: checker, quantized initializer types and bytes, sha256 output, sizes."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx_util import initializers, run_onnx
from tests_helpers import tensors

FORMATS = ["fp8", "nvfp4", "mxfp4"]
Q = "model.layers.0.self_attn.q_proj"
# initializer name -> ONNX type, per format (opset 23)
TYPES = {
    "fp8": {f"{Q}.weight": T.FLOAT8E4M3FN, f"{Q}.weight_scale": T.FLOAT, f"{Q}.input_scale": T.FLOAT},
    "nvfp4": {f"{Q}.weight_packed": T.FLOAT4E2M1, f"{Q}.weight_scale": T.FLOAT8E4M3FN,
              f"{Q}.weight_scale_2": T.FLOAT, f"{Q}.input_scale": T.FLOAT},
    "mxfp4": {f"{Q}.weight_packed": T.FLOAT4E2M1, f"{Q}.weight_scale": T.UINT8},
}
CUSTOM = {"fp8": [], "nvfp4": ["trt::TRT_FP4DynamicQuantize"],
          "mxfp4": ["tfcompile::MXFP4DequantizeLinear", "tfcompile::MXFP4DynamicQuantize"]}


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_checker_types_and_bytes(fmt, onnx_artifact, tmp_path, run_cli):
    art = onnx_artifact(fmt)
    out = tmp_path / "model.onnx"
    res = run_cli("export-onnx", art, "-o", out, "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["ok"] and doc["format"] == fmt and doc["opset"] == 23 and not doc["external_data"]
    assert doc["files"] == {str(out): sha256(out)} and doc["custom_ops"] == CUSTOM[fmt]
    onnx.checker.check_model(str(out), full_check=True)
    init, stored = initializers(out), tensors(art)
    for name, kind in TYPES[fmt].items():
        assert init[name].data_type == kind, name
    n, k = stored[f"{Q}.weight" if fmt == "fp8" else f"{Q}.weight_packed"].shape
    data = f"{Q}.weight" if fmt == "fp8" else f"{Q}.weight_packed"
    assert list(init[data].dims) == [n, k if fmt == "fp8" else 2 * k]  # FLOAT4E2M1 dims count elements
    for name in (data, f"{Q}.weight_scale") if fmt != "fp8" else (data,):  # the artifact's bytes, as they are
        assert init[name].raw_data == stored[name].contiguous().view(torch.uint8).numpy().tobytes(), name
    if fmt == "nvfp4":  # the divisor TensorRT multiplies by: 1 / compressed-tensors' weight_global_scale
        ws2 = onnx.numpy_helper.to_array(init[f"{Q}.weight_scale_2"])
        assert ws2.shape == () and ws2 == np.float32(1.0) / stored[f"{Q}.weight_global_scale"].numpy()[0]
    model = onnx.load(str(out))
    dq = next(nd for nd in model.graph.node if nd.op_type in ("DequantizeLinear", "MXFP4DequantizeLinear")
              and nd.input[0] == data)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in dq.attribute}
    if fmt != "fp8":  # block quantization along K
        assert attrs["axis"] == -1 and attrs["block_size"] == (16 if fmt == "nvfp4" else 32)
    assert sorted(f"{f.domain}::{f.name}" for f in model.functions) == CUSTOM[fmt]


def test_stdout_is_sha256sum_lines(onnx_artifact, tmp_path, run_cli):
    out = tmp_path / "m.onnx"
    res = run_cli("export-onnx", onnx_artifact("mxfp4"), "-o", out, "--external-data", "always")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    data = tmp_path / "m.onnx.data"
    assert lines == [f"{sha256(out)}  {out}", f"{sha256(data)}  {data}"]
    assert "wrote" in res.err and "MXFP4DynamicQuantize" in res.err


def linear_weight_bytes(path) -> int:
    """Bytes of every q/k/v/o/gate/up/down initializer (weights and their scales)."""
    pat = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight")
    return sum(len(t.raw_data) for name, t in initializers(path).items() if pat.search(name))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_4bit_weights_at_most_0_3_of_bf16(fmt, exported):
    ratio = linear_weight_bytes(exported(fmt)) / linear_weight_bytes(exported("bf16"))
    assert ratio <= 0.3, ratio  # NVFP4 4.5 bits/16 = 0.281; MXFP4 4.25/16 = 0.266


def test_external_data_streams_aligned_and_runs(onnx_artifact, exported, tmp_path):
    from tfcompile.onnx_export import OnnxExportConfig, export_to_path, view_from_path

    res = export_to_path(view_from_path(onnx_artifact("fp8")), tmp_path / "x.onnx",
                         OnnxExportConfig(inline_limit=1))  # "auto" above 1 byte: external
    assert res.external_data and set(res.files) == {"x.onnx", "x.onnx.data"}
    onnx.checker.check_model(str(res.path), full_check=True)
    ext = [t for t in initializers(res.path).values() if t.data_location == T.EXTERNAL]
    assert len(ext) > 10
    for t in ext:
        meta = {e.key: e.value for e in t.external_data}
        assert meta["location"] == "x.onnx.data" and int(meta["offset"]) % 64 == 0
    ids = np.random.default_rng(0).integers(4, 256, (1, 8))
    (a,), rt = run_onnx(res.path, ids)
    (b,), _ = run_onnx(exported("fp8"), ids)
    assert rt == "onnxruntime" and np.array_equal(a, b)


def test_opset_24_stores_e8m0_scales(onnx_artifact, exported, tmp_path, run_cli):
    out = tmp_path / "o24.onnx"
    assert run_cli("export-onnx", onnx_artifact("mxfp4"), "-o", out, "--opset", "24").code == 0
    onnx.checker.check_model(str(out), full_check=True)
    assert initializers(out)[f"{Q}.weight_scale"].data_type == T.FLOAT8E8M0
    model = onnx.load(str(out))
    dq = next(nd for nd in model.graph.node if nd.input and nd.input[0] == f"{Q}.weight_packed")
    assert dq.op_type == "DequantizeLinear"  # the standard op takes E8M0 scales from opset 24
    ids = np.random.default_rng(1).integers(4, 256, (1, 8))
    (a,), _ = run_onnx(out, ids)
    (b,), _ = run_onnx(exported("mxfp4"), ids)
    assert np.array_equal(a, b)
