"""The emit pass: `tfcompile quantize --target`, kernels written into the artifact, checksummed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tune_support import quantize

STANDIN = ("--set", "emit.kernels=standin_bf16_gemm", "--set", "emit.buckets=[1,64]")


def _tree(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_plan_schedules_emit_only_with_a_target(run_cli, tmp_path):
    names = lambda res: [p["name"] for p in res.json()["passes"]]  # noqa: E731
    res = run_cli("plan", "--format", "nvfp4a16", "--target", "sm_90a,sm_100a")
    assert res.code == 0, res.err
    assert names(res) == ["load", "select", "quantize", "pack", "emit", "manifest", "verify"]
    emit = next(p for p in res.json()["passes"] if p["name"] == "emit")
    assert emit["config"]["targets"] == ["sm_90a", "sm_100a"] and emit["config"]["buckets"][0] == 1
    assert "emit" not in names(run_cli("plan", "--format", "nvfp4a16"))
    recipe = tmp_path / "r.toml"
    recipe.write_text('version = 1\nformat = "fp8"\n[passes.emit]\ntargets = ["sm_100a"]\n')
    assert "emit" in names(run_cli("plan", "--recipe", recipe))
    bad = run_cli("plan", "--format", "nvfp4a16", "--target", "sm_75")
    assert bad.code == 1 and "unknown target 'sm_75'" in bad.err and "hint:" in bad.err
    bad = run_cli("plan", "--format", "nvfp4a16", "--target", "sm_90a", "--set", "emit.kernels=nope")
    assert bad.code == 1 and "unknown kernel" in bad.err


def test_emit_both_targets(tiny_llama_src, tmp_path, run_cli, standin_kernels):
    out = tmp_path / "out"
    quantize(tiny_llama_src, out, "nvfp4a16", "--target", "sm_90a,sm_100a", *STANDIN)
    kernels = sorted(p.relative_to(out).as_posix() for p in (out / "kernels").rglob("*") if p.is_file())
    # 4 distinct shapes x 2 buckets x 2 targets x (cubin, ptx, json) + index + tuning table
    assert len(kernels) == 4 * 2 * 2 * 3 + 2
    assert "kernels/sm_90a/standin_bf16_gemm_256x128_m64.cubin" in kernels
    for target, op in (("sm_90a", "wgmma.mma_async"), ("sm_100a", "tcgen05.mma")):
        for ptx in (out / "kernels" / target).glob("*.ptx"):
            text = ptx.read_text()
            assert op in text and f".target {target}" in text, ptx.name
            assert ".file" not in text  # no line info: nothing of this machine's paths
    doc = json.loads((out / "kernels/sm_100a/standin_bf16_gemm_128x256_m1.json").read_text())
    assert doc["kernel"] == "standin_bf16_gemm" and doc["m_bucket"] == 1 and (doc["n"], doc["k"]) == (128, 256)
    assert doc["shared_bytes"] > 0 and doc["num_warps"] == doc["config"]["num_warps"]
    assert doc["arg_order"][:3] == ["x_ptr", "w_ptr", "y_ptr"] and doc["constexprs"]["N"] == 128
    assert doc["grid"]["formula"].startswith("(cdiv(M, ") and doc["grid"]["tiles"]["BLOCK_M"] >= 64
    assert doc["chosen_by"]["method"] == "cost-model" and doc["triton"] == doc["triton_metadata"]["triton_version"]
    manifest = json.loads((out / "tfcompile" / "manifest.json").read_text())
    for rel in kernels:
        assert manifest["files"][rel] == hashlib.sha256((out / rel).read_bytes()).hexdigest(), rel
    index = json.loads((out / "kernels" / "index.json").read_text())
    assert index["targets"]["sm_90a"]["gemm"] == ["standin_bf16_gemm"] and len(index["kernels"]) == 16
    assert run_cli("verify", out).code == 0
    again = tmp_path / "again"
    quantize(tiny_llama_src, again, "nvfp4a16", "--target", "sm_90a,sm_100a", *STANDIN)
    assert _tree(out / "kernels") == _tree(again / "kernels")
    assert (out / "tfcompile/manifest.json").read_bytes() == (again / "tfcompile/manifest.json").read_bytes()


def test_emit_takes_configs_from_a_table_and_falls_back_when_one_fails(tiny_llama_src, tmp_path,
                                                                     standin_kernels):
    first = tmp_path / "first"
    args = ("--set", "emit.kernels=standin_bf16_gemm", "--set", "emit.buckets=[16]")
    quantize(tiny_llama_src, first, "nvfp4a16", "--target", "sm_90a", *args)
    table = json.loads((first / "kernels" / "tuning.json").read_text())
    key = next(k for k in table["entries"] if ":128x256:" in k)
    good = table["entries"][key]["config"]
    table["entries"][key]["config"] = dict(good, BLOCK_N=48)  # tl.arange needs powers of two
    table["entries"][key]["method"] = "measured"
    edited = tmp_path / "table.json"
    edited.write_text(json.dumps(table))
    second = tmp_path / "second"
    quantize(tiny_llama_src, second, "nvfp4a16", "--target", "sm_90a", *args, "--set", f"emit.tuning={edited}")
    doc = json.loads((second / "kernels/sm_90a/standin_bf16_gemm_128x256_m16.json").read_text())
    assert doc["chosen_by"]["method"] == "measured"
    assert doc["chosen_by"]["fallback_from"] == [dict(good, BLOCK_N=48)]
    assert doc["config"] == table["entries"][key]["runner_up"][0]["config"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt, target, gemm, act, ops", [
    ("nvfp4", "sm_100a", "fp4_gemm_nvfp4", "act_quant_nvfp4", ("tcgen05.mma", "block_scale")),
    ("nvfp4", "sm_90a", "w4a16_gemm_nvfp4", None, ("wgmma.mma_async",)),
    ("fp8", "sm_90a", "fp8_gemm_tensor", "act_quant_fp8_static", ("wgmma.mma_async", "e4m3")),
])
def test_emit_real_kernels(tiny_llama_src, tmp_path, run_cli, fmt, target, gemm, act, ops):
    from tfcompile.tune.registry import load_kernels

    kernels, _ = load_kernels()
    assert gemm in kernels and (act is None or act in kernels), "kernels/triton must register them"
    out = tmp_path / "out"
    quantize(tiny_llama_src, out, fmt, "--target", target, "--set", "emit.buckets=[16]")
    ptx = (out / f"kernels/{target}/{gemm}_128x256_m16.ptx").read_text()
    assert all(op in ptx for op in ops), gemm
    if act:
        assert (out / f"kernels/{target}/{act}_k256_m16.cubin").is_file()
    assert run_cli("verify", out).code == 0


DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
# issue #5 acceptance: the demo model's kernels for both targets, with the PTX checks
DEMO_OPS = {("nvfp4", "sm_90a"): ("w4a16_gemm_nvfp4", ("wgmma.mma_async",)),
            ("nvfp4", "sm_100a"): ("fp4_gemm_nvfp4", ("tcgen05.mma", "kind::mxf4nvf4.block_scale")),
            ("fp8", "sm_90a"): ("fp8_gemm_tensor", ("wgmma.mma_async", "e4m3")),
            ("fp8", "sm_100a"): ("fp8_gemm_tensor", ("tcgen05.mma", "kind::f8f6f4"))}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_emit_demo_lm_both_targets(tmp_path, run_cli, fmt):
    out = tmp_path / "out"
    quantize(DEMO, out, fmt, "--target", "sm_90a,sm_100a", "--set", "emit.buckets=[16]")  # calib: tune_support
    shapes = {(256, 256), (128, 256), (768, 256), (256, 768)}  # q/o, k/v, gate/up, down of the demo LM
    for target in ("sm_90a", "sm_100a"):
        gemm, ops = DEMO_OPS[(fmt, target)]
        for n, k in shapes:
            ptx = (out / f"kernels/{target}/{gemm}_{n}x{k}_m16.ptx").read_text()
            missing = [op for op in ops if op not in ptx]
            assert not missing, (target, gemm, n, k, missing)
            assert (out / f"kernels/{target}/{gemm}_{n}x{k}_m16.cubin").stat().st_size > 0
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    emitted = [f for f in manifest["files"] if f.startswith("kernels/")]
    assert len(emitted) >= 2 * 3 * len(shapes)  # cubin + ptx + json per GEMM and target, plus act-quant
    assert run_cli("verify", out).code == 0
