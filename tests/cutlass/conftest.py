"""Fixtures for tests/cutlass: one CUTLASS compile cache per test session, demo-LM artifacts.

The cache: $TFCOMPILE_CUTLASS_TEST_CACHE when set (e.g. a persistent directory, for warm
runs), else one directory per pytest session shared by the xdist workers (their basetemps'
parent), so each distinct source is compiled once per session however tests are spread:
the build's per-key file lock makes a second worker wait and then hit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cutlass_support

from cutlass_support import DEMO, demo_args, quantize  # noqa: E402


@pytest.fixture(scope="session")
def cutlass_cache_root(tmp_path_factory) -> Path:
    given = os.environ.get("TFCOMPILE_CUTLASS_TEST_CACHE")
    if given:
        return Path(given)
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return root / "tfcompile-cutlass-cache"


@pytest.fixture
def cutlass_cache(cutlass_cache_root, monkeypatch) -> Path:
    """TFCOMPILE_CACHE for this test: the session's shared cache (kernels land in <it>/cutlass)."""
    monkeypatch.setenv("TFCOMPILE_CACHE", str(cutlass_cache_root))
    return cutlass_cache_root / "cutlass"


@pytest.fixture(scope="session")
def demo_artifact(tmp_path_factory, cutlass_cache_root):
    """demo_artifact(fmt) -> (path, quantize --json doc) of the demo LM with CUTLASS kernels for
    both targets, compiled (built once per format and session)."""
    built: dict[str, tuple[Path, dict]] = {}
    root = tmp_path_factory.mktemp("cutlass-demo")

    def get(fmt: str):
        if fmt not in built:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("TFCOMPILE_CACHE", str(cutlass_cache_root))
                out = root / fmt
                doc = quantize(DEMO, out, fmt, *demo_args(fmt))
            built[fmt] = (out, doc)
        return built[fmt]

    return get

