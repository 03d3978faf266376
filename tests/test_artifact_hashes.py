"""Byte identity: a representative subset of bench/artifact_hashes.py's matrix, rebuilt and compared
file by file with the recorded sha256 (bench/artifact_hashes.baseline.json).

A change that alters any byte of these artifacts fails here; if the change is meant to (a new
manifest field, a different rounding), re-record the baseline with
`python bench/artifact_hashes.py --record` in the same commit and say why. The bytes depend on
the installed versions too (the manifest records them, Triton makes the cubins), so the
comparison runs only where the environment equals the baseline's (CI installs the same pins);
those of calibrated, solved or evaluated runs on the CPU too (bench/artifact_hashes.py's doc).
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
    assert {cases[n][0] for n in hashes.CI_CASES} == {"demo", "tiny", "moe", "gptoss", "deepseek-fp8", "gptoss-mxfp4", "hub"}
    for flag in ("--kv-cache", "modelopt", "gptq", "awq", "--layout", "onnx", "--target", "--cutlass",
                 "--eval", "distill", "--calib-all-experts", "--sign", "--report", "--revision"):
        assert flag in args, flag


def _build(name: str, work) -> dict:
    threads = torch.get_num_threads()
    try:
        return hashes.build([name], work, verbose=False)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("name", hashes.CI_CASES)
def test_artifact_bytes_match_baseline(name, baseline, tmp_path):
    """Byte-identical to the baseline; a CPU-dependent case (float sums: its manifest names the CPU)
    on a CPU the baseline has no recording for is instead rebuilt and must be identical run to run."""
    got = _build(name, tmp_path / "first")
    assert hashes.compare(baseline, got, [name]) == []
    if hashes.expected(baseline, name, got["cpu"]) is None:
        again = _build(name, tmp_path / "again")
        assert hashes.compare_runs(baseline, got, again, [name]) == []


def test_ci_cases_include_cpu_independent_runs_compared_on_every_cpu():
    """Data-free RTN is integer-exact: those cases hold on every CPU, whatever CPU recorded the baseline."""
    doc = json.loads(hashes.BASELINE.read_text())
    independent = [n for n in hashes.CI_CASES if not doc["artifacts"][n]["cpu_dependent"]]
    assert len(independent) >= 3, independent
    assert doc["cpu"] and all(hashes.expected(doc, n, "some other CPU") == doc["artifacts"][n]["files"]
                              for n in independent)


def test_compare_names_every_difference():
    """The comparison itself: a changed, a missing and a new file, and a changed source, are each named."""
    base = {"cpu": "A", "sources": {"demo": {"a": "1"}},
            "artifacts": {"x": {"model": "demo", "args": ["quantize"], "files": {"f": "1", "g": "2"}}}}
    got = {"cpu": "A", "sources": {"demo": {"a": "2"}},
           "artifacts": {"x": {"model": "demo", "args": ["quantize"], "files": {"f": "9", "h": "3"}}}}
    assert hashes.compare(base, got, ["x"]) == [
        "source demo: the input checkpoint itself differs from the baseline's",
        "x: f differs", "x: g missing", "x: h is new"]
    assert hashes.compare(base, base, ["x"]) == []


def test_cpu_dependent_cases_compare_against_their_own_cpu():
    """A CPU-dependent case: the baseline's bytes on its own CPU, another CPU's recording there, and on
    a CPU nobody recorded, the run-to-run check (which still names a difference and a changed file list)."""
    files = {"f": "1", "g": "2"}
    base = {"cpu": "A", "sources": {}, "other_cpus": {"B": {"x": {"f": "7", "g": "8"}}},
            "artifacts": {"x": {"model": "demo", "args": ["q"], "files": files, "cpu_dependent": True}}}

    def got(cpu, f, dep=True):
        return {"cpu": cpu, "sources": {}, "artifacts": {"x": {"model": "demo", "args": ["q"], "files": f,
                                                               "cpu_dependent": dep}}}
    assert hashes.compare(base, got("A", {"f": "1", "g": "3"}), ["x"]) == ["x: g differs"]
    assert hashes.compare(base, got("B", {"f": "7", "g": "8"}), ["x"]) == []
    assert hashes.compare(base, got("B", files), ["x"]) == ["x: f differs", "x: g differs"]
    assert hashes.expected(base, "x", "C") is None and hashes.compare(base, got("C", {"f": "5"}), ["x"]) == []
    assert hashes.compare_runs(base, got("C", {"f": "5", "g": "6"}), got("C", {"f": "5", "g": "6"}), ["x"]) == []
    assert hashes.compare_runs(base, got("C", {"f": "5", "g": "6"}), got("C", {"f": "5", "g": "0"}), ["x"]) == [
        "x: g differs between two runs on this CPU"]
    assert hashes.compare_runs(base, got("C", {"f": "5"}), got("C", {"f": "5"}), ["x"]) == [
        "x: files ['g'] differ from the baseline's list"]
    assert hashes.compare(base, got("A", files, dep=False), ["x"]) == [
        "x: CPU-dependent False, baseline True (the manifest's `machine` record)"]
