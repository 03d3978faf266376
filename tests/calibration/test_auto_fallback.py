"""`--calib auto` that passes over python-doc says so (stderr, --json, manifest, report), and
`--calib-strict` refuses instead: the same command must not calibrate on other text, and so give
other weights, on a runner that lacks Debian's python3.11-doc (issue: CI runners differ)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfcompile.calibration import corpus
from tfcompile.calibration.datasets import STDLIB, auto_source

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-llama"  # committed, with its tokenizer
CALIB = ("--calib-samples", "2", "--calib-seq-len", "32")


@pytest.fixture
def no_python_doc(monkeypatch, tmp_path):
    monkeypatch.setattr(corpus, "PYTHON_DOC_DIR", tmp_path / "no-python-doc")


def test_fallback_is_a_warning_everywhere_it_is_reported(run_cli, tmp_path, no_python_doc):
    out = tmp_path / "out"
    res = run_cli("quantize", TINY, "-o", out, "--format", "nvfp4", *CALIB, "--json", "--report")
    assert res.code == 0, res.err
    (warning,) = [w for w in res.json()["warnings"] if "--calib auto fell back" in w]
    assert f"fell back to {STDLIB}" in warning and "python-doc" in warning and "no-python-doc" in warning
    assert "fell back to" in res.err  # stderr, for people
    calib = json.loads((out / "tfcompile" / "manifest.json").read_text())["calibration"]
    assert calib["data"].startswith(STDLIB) and calib["fallback"] == warning
    page = (out / "tfcompile" / "report.html").read_text()
    assert "calibration fallback" in page and f"{STDLIB}(seed=0)" in page


def test_strict_refuses_to_fall_back_and_writes_nothing(run_cli, tmp_path, no_python_doc):
    out = tmp_path / "out"
    res = run_cli("quantize", TINY, "-o", out, "--format", "nvfp4", *CALIB, "--calib-strict")
    assert res.code == 1 and "would fall back to" in res.err and "--calib-strict" in res.err
    assert "hint: install the text (apt-get install python3.11-doc)" in res.err
    assert not out.exists()


def test_no_warning_when_python_doc_serves(run_cli, tmp_path):
    out = tmp_path / "out"
    res = run_cli("quantize", TINY, "-o", out, "--format", "nvfp4", *CALIB, "--calib-strict", "--json")
    assert res.code == 0, res.err
    assert not [w for w in res.json()["warnings"] if "fell back" in w]
    calib = json.loads((out / "tfcompile" / "manifest.json").read_text())["calibration"]
    assert calib["data"] == "python-doc(seed=0)" and "fallback" not in calib


def test_strict_is_a_policy_a_data_free_run_accepts(run_cli, tmp_path):
    """A release pipeline passes --calib-strict to every format; weight-only RTN has nothing to calibrate."""
    assert run_cli("quantize", TINY, "-o", tmp_path / "o", "--format", "nvfp4a16", "--calib-strict", "-q").code == 0
    res = run_cli("quantize", TINY, "-o", tmp_path / "p", "--format", "nvfp4a16", "--calib-samples", "3", "-q")
    assert res.code == 1 and "needs no calibration data" in res.err  # a real calibration option still is refused


def test_auto_source_names_why_each_source_was_passed_over(no_python_doc):
    assert auto_source(None, None, 64) == ("self", ("python-doc: the checkpoint has no tokenizer",
                                                    f"{STDLIB}: the checkpoint has no tokenizer"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    choice, refused = auto_source(tok, None, 64)
    assert choice == STDLIB and len(refused) == 1 and refused[0].startswith("python-doc: ")
    choice, refused = auto_source(tok, None, 10**12)  # more tokens than the stdlib holds
    assert choice == "self" and refused[1] == f"{STDLIB}: it holds fewer than 1.25 x {10**12} tokens"
