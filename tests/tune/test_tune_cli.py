"""`tfcompile tune`: the tuning table in the artifact, its checksum, determinism, errors."""

from __future__ import annotations

import hashlib
import json

import pytest


def _manifest(path):
    return json.loads((path / "tfcompile" / "manifest.json").read_text())


def test_tune_writes_a_deterministic_table_recorded_in_the_manifest(tiny_artifact, run_cli, standin_kernels):
    art = tiny_artifact("nvfp4a16")
    res = run_cli("tune", art, "--target", "sm_90a,sm_100a", "--buckets", "1,64", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    table_path = art / "kernels" / "tuning.json"
    data = table_path.read_bytes()
    assert doc["ok"] and doc["sha256"] == hashlib.sha256(data).hexdigest()
    assert _manifest(art)["files"]["kernels/tuning.json"] == doc["sha256"]
    table = json.loads(data)
    assert list(table["entries"]) == sorted(table["entries"])
    # 4 distinct Linear shapes x 2 buckets x 2 targets x the GEMMs serving nvfp4a16 (stand-in included)
    kernels = {e["kernel"] for e in table["entries"].values()}
    assert "standin_bf16_gemm" in kernels and len(table["entries"]) == 16 * len(kernels)
    e = table["entries"]["standin_bf16_gemm:sm_90a:256x128:m1:triton-" + e_triton(table)]
    assert e["method"] == "cost-model" and e["predicted_us"] > 0 and e["m_bucket"] == 1
    assert len(e["runner_up"]) == 3 and all(r["predicted_us"] >= e["predicted_us"] for r in e["runner_up"])
    assert e["space"]["feasible"] + sum(e["space"]["pruned"].values()) >= e["space"]["candidates"]
    assert "tuning" not in res.out.splitlines()[0]  # stdout is the JSON document only
    assert "standin_bf16_gemm" in res.err and "model" in res.err  # the tables went to stderr
    assert run_cli("verify", art).code == 0
    again = run_cli("tune", art, "--target", "sm_90a,sm_100a", "--buckets", "1,64", "-q")
    assert again.code == 0 and table_path.read_bytes() == data


def e_triton(table) -> str:
    return next(iter(table["entries"].values()))["triton"]


def test_tune_merges_targets_and_real_kernels_serve_each_scheme(tiny_artifact, run_cli):
    art = tiny_artifact("nvfp4a16")
    assert run_cli("tune", art, "--target", "sm_90a", "--buckets", "16", "-q").code == 0
    assert run_cli("tune", art, "--target", "sm_100a", "--buckets", "16", "-q").code == 0
    table = json.loads((art / "kernels" / "tuning.json").read_text())
    targets = {e["target"] for e in table["entries"].values()}
    assert targets == {"sm_90a", "sm_100a"}  # the second run kept the first's entries


@pytest.mark.parametrize("args, code, message", [
    (("--target", "sm_80"), 1, "unknown target 'sm_80'"),
    (("--buckets", "1,x"), 1, "--buckets"),
    (("--buckets", "0"), 1, "positive"),
    (("--kernel", "nope"), 1, "unknown kernel"),
    pytest.param(("--measure",), 1, "cannot measure", marks=pytest.mark.cpu_only),
])
def test_tune_errors(tiny_artifact, run_cli, args, code, message):
    import torch

    if "--measure" in args and torch.cuda.is_available():
        pytest.skip("a GPU is present: --measure measures")
    res = run_cli("tune", tiny_artifact("nvfp4a16"), *args)
    assert res.code == code and message in res.err and "hint:" in res.err, res.err


def test_tune_refuses_what_is_not_an_artifact(tmp_path, run_cli):
    res = run_cli("tune", tmp_path)
    assert res.code == 1 and "not a tfcompile artifact" in res.err and "hint:" in res.err


@pytest.mark.cpu_only
def test_gpu_bench_exits_2_without_a_gpu():
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_kernels.py"
    res = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "needs an H100/H200/B200" in res.stderr and "hint:" in res.stderr
    assert res.stdout == ""
