"""Byte identity: a representative subset of bench/artifact_hashes.py's matrix, rebuilt and compared
file by file with the recorded sha256 (bench/artifact_hashes.baseline.json).

A change that alters any byte of these artifacts fails here; if the change is meant to (a new
manifest field, a different rounding), re-record the baseline with
`python bench/artifact_hashes.py --record` in the same commit and say why. The bytes depend on
the installed versions too (the manifest records them, Triton makes the cubins), so the
comparison runs only where the environment equals the baseline's (CI installs the same pins).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

_BENCH = Path(__file__).resolve().parent.parent / "bench" / "artifact_hashes.py"
_spec = importlib.util.spec_from_file_location("tfcompile_bench_artifact_hashes", _BENCH)
hashes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hashes)


@pytest.fixture(scope="module")
def baseline() -> dict:
    doc = json.loads(hashes.BASELINE.read_text())
    mismatch = hashes.env_mismatch(doc)
    if mismatch:
        pytest.skip("installed versions differ from the baseline's: " + "; ".join(mismatch))
    return doc


def test_ci_cases_cover_every_kind_of_run():
    """The subset spans the models (dense, MoE, a family, a published source, a Hub id) and every
    pass and option that writes bytes."""
    cases = hashes.cases()
    args = " ".join(" ".join(cases[n][1]) for n in hashes.CI_CASES)
    assert {cases[n][0] for n in hashes.CI_CASES} == {"demo", "tiny", "moe", "gptoss", "deepseek-fp8", "hub"}
    for flag in ("--kv-cache", "modelopt", "gptq", "awq", "--layout", "onnx", "--target", "--cutlass",
                 "--eval", "distill", "--calib-all-experts", "--sign", "--report", "--revision"):
        assert flag in args, flag


@pytest.mark.slow
@pytest.mark.parametrize("name", hashes.CI_CASES)
def test_artifact_bytes_match_baseline(name, baseline, tmp_path):
    threads = torch.get_num_threads()
    try:
        got = hashes.build([name], tmp_path, verbose=False)
    finally:
        torch.set_num_threads(threads)
    assert hashes.compare(baseline, got, [name]) == []


def test_compare_names_every_difference():
    """The comparison itself: a changed, a missing and a new file, and a changed source, are each named."""
    base = {"sources": {"demo": {"a": "1"}},
            "artifacts": {"x": {"model": "demo", "args": ["quantize"], "files": {"f": "1", "g": "2"}}}}
    got = {"sources": {"demo": {"a": "2"}},
           "artifacts": {"x": {"model": "demo", "args": ["quantize"], "files": {"f": "9", "h": "3"}}}}
    assert hashes.compare(base, got, ["x"]) == [
        "source demo: the input checkpoint itself differs from the baseline's",
        "x: f differs", "x: g missing", "x: h is new"]
    assert hashes.compare(base, base, ["x"]) == []
