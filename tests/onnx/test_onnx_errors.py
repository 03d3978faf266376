"""What export-onnx refuses: a clear error class with a hint, exit 1, nothing left behind."""

from __future__ import annotations

import json
import shutil

import pytest

from tfcompile.onnx_export import ArtifactView, OnnxExportError, check_exportable
from tfcompile.schemes import get_scheme


def assert_user_error(res, *words: str) -> None:
    assert res.code == 1, res.err
    assert "error:" in res.err and "\nhint: " in res.err and "Traceback" not in res.err
    for w in words:
        assert w in res.err, res.err


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_fp8_block_cannot_be_expressed(onnx_artifact, tmp_path, run_cli):
    res = run_cli("export-onnx", onnx_artifact("fp8-block"), "-o", tmp_path / "m.onnx")
    assert_user_error(res, "128x128", "block_size")
    assert leftovers(tmp_path) == []


def test_k_not_divisible_by_block(onnx_artifact, tmp_path, run_cli):
    """An artifact whose manifest says K=200 for an NVFP4 layer (block 16): refused up front."""
    art = tmp_path / "art"
    shutil.copytree(onnx_artifact("nvfp4a16"), art)
    man = art / "tfcompile" / "manifest.json"
    doc = json.loads(man.read_text())
    doc["layers"][0]["shape"] = [doc["layers"][0]["shape"][0], 200]
    man.write_text(json.dumps(doc))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = run_cli("export-onnx", art, "-o", out_dir / "m.onnx")
    assert_user_error(res, "K=200", "block size 16", "--ignore")
    assert leftovers(out_dir) == []


def test_check_exportable_names_the_layer():
    view = ArtifactView(None, {"architectures": ["LlamaForCausalLM"]}, get_scheme("mxfp4"),
                        {"model.layers.0.mlp.down_proj": (128, 100)})
    with pytest.raises(OnnxExportError) as e:
        check_exportable(view, 23)
    assert "model.layers.0.mlp.down_proj" in e.value.message and e.value.hint and e.value.exit_code == 1


def test_fp4_needs_opset_23(onnx_artifact, tmp_path, run_cli):
    res = run_cli("export-onnx", onnx_artifact("nvfp4a16"), "-o", tmp_path / "m.onnx", "--opset", "21")
    assert_user_error(res, "opset >= 23")
    assert leftovers(tmp_path) == []


def test_unsupported_opset_and_architecture(model_factory, tmp_path, run_cli):
    res = run_cli("export-onnx", "/nonexistent/x", "-o", tmp_path / "m.onnx")
    assert_user_error(res, "not a directory")
    moe = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    res = run_cli("export-onnx", moe, "-o", tmp_path / "m.onnx")
    assert_user_error(res, "Qwen3MoeForCausalLM", "LlamaForCausalLM")
    res = run_cli("export-onnx", moe, "-o", tmp_path / "m.onnx", "--opset", "7")
    assert_user_error(res, "opset 7")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moe"]


def test_existing_output_needs_overwrite(onnx_artifact, tmp_path, run_cli):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"keep me")
    assert_user_error(run_cli("export-onnx", onnx_artifact("mxfp4"), "-o", out), "already exists", "--overwrite")
    assert out.read_bytes() == b"keep me"
    assert run_cli("export-onnx", onnx_artifact("mxfp4"), "-o", out, "--overwrite").code == 0
    assert out.read_bytes() != b"keep me" and leftovers(tmp_path) == ["m.onnx"]


def test_quantize_export_onnx_fp8_block_publishes_nothing(tiny_llama, tmp_path, run_cli):
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", "fp8-block", "--export", "onnx")
    assert_user_error(res, "128x128")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
