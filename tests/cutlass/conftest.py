"""Fixtures for tests/cutlass: the CUTLASS compile cache, demo-LM artifacts.

The cache is tfcompile's own (kernels/cutlass/build.py: $TFCOMPILE_CACHE/cutlass, default
~/.cache/tfcompile/cutlass), keyed by the content hash of everything that makes the object
(source, nvcc version, flags, CUTLASS version, host compiler), so an entry is valid across runs
and a warm run compiles nothing. $TFCOMPILE_CUTLASS_TEST_CACHE=DIR uses DIR instead, and
=session one directory per pytest session shared by the xdist workers (their basetemps'
parent: every source compiled once per session). The build's per-key file lock makes a
second worker wait and then hit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cutlass_support

from cutlass_support import DEMO, demo_args, quantize, variant_format  # noqa: E402


@pytest.fixture(scope="session")
def cutlass_cache_root(tmp_path_factory) -> Path:
    from tfcompile.kernels.cutlass.toolchain import cache_root

    given = os.environ.get("TFCOMPILE_CUTLASS_TEST_CACHE")
    if given and given != "session":
        return Path(given)
    if not given:
        return cache_root().parent  # TFCOMPILE_CACHE (kernels land in <it>/cutlass)
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
    """demo_artifact(variant) -> (path, quantize --json doc) of the demo LM with CUTLASS kernels for
    both targets, compiled (built once per variant and session; cutlass_support.VARIANTS)."""
    built: dict[str, tuple[Path, dict]] = {}
    root = tmp_path_factory.mktemp("cutlass-demo")

    def get(fmt: str):
        if fmt not in built:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("TFCOMPILE_CACHE", str(cutlass_cache_root))
                out = root / fmt
                doc = quantize(DEMO, out, variant_format(fmt), *demo_args(fmt))
            built[fmt] = (out, doc)
        return built[fmt]

    return get

