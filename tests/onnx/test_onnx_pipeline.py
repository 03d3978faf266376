"""`quantize --export onnx`: the onnx pass's place in the recipe and the manifest's checksums."""

from __future__ import annotations

import hashlib
import json

import onnx


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_plan_schedules_onnx_after_pack(run_cli, tmp_path):
    res = run_cli("plan", "--format", "nvfp4", "--export", "onnx", "--export", "modelopt")
    assert res.code == 0, res.err
    doc = res.json()
    names = [p["name"] for p in doc["passes"]]
    assert names[names.index("pack") + 1] == "onnx" and names.index("onnx") < names.index("manifest")
    pack = next(p for p in doc["passes"] if p["name"] == "pack")
    assert pack["config"]["export"] == ["modelopt"]  # pack keeps only the views it writes
    onnx_pass = next(p for p in doc["passes"] if p["name"] == "onnx")
    assert onnx_pass["config"] == {"opset": 23, "external_data": "auto", "path": "onnx/model.onnx"}
    # a recipe's pack.export = ["onnx"], or any onnx.* setting, schedules the pass too
    recipe = tmp_path / "r.toml"
    recipe.write_text('version = 1\nformat = "mxfp4"\n[passes.pack]\nexport = ["onnx"]\n')
    assert "onnx" in [p["name"] for p in run_cli("plan", "--recipe", recipe).json()["passes"]]
    res = run_cli("plan", "--format", "fp8", "--set", "onnx.opset=24")
    assert [p["config"] for p in res.json()["passes"] if p["name"] == "onnx"][0]["opset"] == 24
    assert "onnx" not in [p["name"] for p in run_cli("plan", "--format", "fp8").json()["passes"]]


def test_quantize_export_onnx_lists_files_in_manifest(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4", "--export", "onnx",
                  "--set", "onnx.external_data=always", "--json")
    assert res.code == 0, res.err
    stats = res.json()["passes"]["onnx"]
    assert stats["files"] == ["onnx/model.onnx", "onnx/model.onnx.data"] and stats["external_data"]
    man = json.loads((out / "tfcompile" / "manifest.json").read_text())
    for rel in stats["files"]:
        assert man["files"][rel] == sha256(out / rel)
    assert man["views"] == ["compressed-tensors", "onnx"]
    onnx.checker.check_model(str(out / "onnx" / "model.onnx"), full_check=True)
    assert run_cli("verify", out).code == 0  # re-hashes the ONNX files too
    (out / "onnx" / "model.onnx.data").write_bytes(b"corrupt")
    assert run_cli("verify", out).code == 1
