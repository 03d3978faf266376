"""tfcompile/settings.py: every TFCOMPILE_* variable read in one place, typed."""

from __future__ import annotations

from pathlib import Path

from tfcompile.settings import settings


def test_defaults_and_overrides():
    s = settings({})
    assert s.cache_dir == Path.home() / ".cache" / "tfcompile" and not s.no_native and s.nvcc is None
    s = settings({"TFCOMPILE_CACHE": "/tmp/c", "TFCOMPILE_NO_NATIVE": "1", "TFCOMPILE_NVCC": "/opt/nvcc"})
    assert s.cache_dir == Path("/tmp/c") and s.no_native and s.nvcc == "/opt/nvcc"
    assert (s.sha256_cache, s.native_kernels_dir, s.cutlass_dir) == (
        Path("/tmp/c/sha256.json"), Path("/tmp/c/kernels"), Path("/tmp/c/cutlass"))
    assert settings({"TFCOMPILE_NVCC": ""}).nvcc is None


def test_the_caches_follow_the_variable(monkeypatch, tmp_path):
    """The three caches that used to read TFCOMPILE_CACHE themselves now take it from settings()."""
    from tfcompile.io.hash_cache import cache_path
    from tfcompile.kernels.cutlass.toolchain import cache_root
    from tfcompile.kernels.formats._native import cache_dir

    monkeypatch.setenv("TFCOMPILE_CACHE", str(tmp_path))
    assert (cache_path(), cache_dir(), cache_root()) == (
        tmp_path / "sha256.json", tmp_path / "kernels", tmp_path / "cutlass")
