"""Fixtures for tests/tune: stand-in kernels and tiny artifacts (built once per session)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # standin, tune_support

from tune_support import quantize  # noqa: E402


@pytest.fixture
def standin_kernels():
    """Register the stand-in GEMMs for one test (names: standin_bf16_gemm, standin_fp8_gemm)."""
    import standin

    names = standin.register()
    yield names
    standin.unregister()


@pytest.fixture(scope="session")
def tiny_artifact_src(tiny_llama_src, tmp_path_factory):
    """tiny_artifact_src("nvfp4a16") -> the tiny Llama quantized in that format, no kernels (cached)."""
    root, cache = tmp_path_factory.mktemp("tune-artifacts"), {}

    def get(fmt: str) -> Path:
        if fmt not in cache:
            quantize(tiny_llama_src, root / fmt, fmt)
            cache[fmt] = root / fmt
        return cache[fmt]

    return get


@pytest.fixture
def tiny_artifact(tiny_artifact_src, tmp_path):
    """A private copy (tune writes into it)."""

    def get(fmt: str) -> Path:
        dst = tmp_path / f"art-{fmt}"
        shutil.copytree(tiny_artifact_src(fmt), dst)
        return dst

    return get
