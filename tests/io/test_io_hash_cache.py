"""The source-hash cache returns hashlib's digest, and never a stale one after a write."""

from __future__ import annotations

import hashlib
import os

from tfcompile.io import hash_cache


def test_cached_digest_is_sha256_and_invalidated_by_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCOMPILE_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"a" * 1000)
    want = hashlib.sha256(b"a" * 1000).hexdigest()
    assert hash_cache.sha256_files_cached([f]) == {f: want}
    assert hash_cache.cache_path().is_file()
    calls = []
    monkeypatch.setattr(hash_cache, "sha256_file", lambda p: calls.append(p) or "x")
    assert hash_cache.sha256_files_cached([f]) == {f: want} and calls == []  # served from cache
    st = os.stat(f)
    f.write_bytes(b"b" * 1000)  # same size; mtime/ctime move
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with mtime put back, ctime changed
    assert hash_cache.sha256_files_cached([f]) == {f: "x"} and calls == [f]


def test_disabled_cache_always_hashes(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCOMPILE_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w"
    f.write_bytes(b"z")
    hash_cache.sha256_files_cached([f], use_cache=False)
    assert not hash_cache.cache_path().exists()


def test_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCOMPILE_CACHE", str(tmp_path / "cache"))
    hash_cache.cache_path().parent.mkdir(parents=True)
    hash_cache.cache_path().write_text("{not json")
    f = tmp_path / "w"
    f.write_bytes(b"q")
    assert hash_cache.sha256_files_cached([f]) == {f: hashlib.sha256(b"q").hexdigest()}
