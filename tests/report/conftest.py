"""Fixtures for tests/report: one tiny-Llama artifact with every section the report has."""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # report_support

from report_support import quantize_args, run_main  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while weights are quantized to four bits per block".split()


@pytest.fixture(scope="session")
def report_text(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("report-text") / "eval.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(100)) + "\n")
    return path


@pytest.fixture(scope="session")
def reported(tiny_llama_src, report_text, tmp_path_factory):
    """(artifact built with --eval --report, the tiny Llama it came from)."""
    out = tmp_path_factory.mktemp("report") / "tiny-nvfp4"
    code, _, err = run_main(quantize_args(tiny_llama_src, out, report_text, "--report"))
    assert code == 0, err[-3000:]
    return out, tiny_llama_src


@pytest.fixture
def hostile_artifact(reported, tmp_path):
    """A copy of the artifact whose manifest names a module with markup in it (the report must escape it)."""
    src, _ = reported
    dst = tmp_path / "hostile"
    shutil.copytree(src, dst)
    path = dst / "tfcompile" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["layers"][0]["module"] = 'model.layers.0.<img src=x onerror="alert(1)">.q_proj'
    doc["source"]["name"] = "<script>alert(2)</script>"
    path.write_text(json.dumps(doc))
    return dst
