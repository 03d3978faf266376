"""atomic_output_dir, sha256_file, copy_aux_files: nothing half-written is ever left at `out`."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import torch

from tfcompile.errors import UserError
from tfcompile.io import atomic as atomic_mod
from tfcompile.io import writer as writer_mod
from tfcompile.io.atomic import atomic_output_dir
from tfcompile.io.aux_files import copy_aux_files
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.io.hashing import sha256_file
from tfcompile.io.writer import ShardWriter, TensorSpec, plan_shards


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_success_publishes_and_leaves_no_temp(tmp_path):
    out = tmp_path / "artifact"
    with atomic_output_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".artifact.tmp-")
        (tmp / "a.txt").write_text("hello")
        assert not out.exists()  # nothing visible until the block ends
    assert (out / "a.txt").read_text() == "hello"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_removes_temp_and_reraises(tmp_path, exc):
    out = tmp_path / "artifact"
    with pytest.raises(type(exc)):
        with atomic_output_dir(out) as tmp:
            (tmp / "partial.safetensors").write_bytes(b"half")
            raise exc
    assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_existing_output_refused_without_overwrite(tmp_path):
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(UserError) as exc:
        with atomic_output_dir(out):
            pytest.fail("body must not run")
    assert str(out) in exc.value.message and "--overwrite" in exc.value.hint
    assert (out / "keep").read_text() == "old"


def test_overwrite_replaces_old_dir(tmp_path):
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "old").write_text("old")
    with atomic_output_dir(out, overwrite=True) as tmp:
        (tmp / "new").write_text("new")
        assert (out / "old").exists()  # the old output stays until the new one is complete
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert _leftovers(tmp_path) == []


def test_overwrite_failure_keeps_old_dir(tmp_path):
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "old").write_text("old")
    with pytest.raises(ValueError):
        with atomic_output_dir(out, overwrite=True) as tmp:
            (tmp / "new").write_text("new")
            raise ValueError("pass failed")
    assert sorted(p.name for p in out.iterdir()) == ["old"]
    assert _leftovers(tmp_path) == []


def test_failed_swap_restores_old_dir(tmp_path, monkeypatch):
    """The exchange that publishes over an old OUT fails (e.g. EXDEV): the old OUT is untouched."""
    from tfcompile.io import publish

    out = tmp_path / "artifact"
    out.mkdir()
    (out / "old").write_text("old")

    def rename2(src, dst, flags):
        raise publish.write_error(dst, OSError(errno.EXDEV, "Invalid cross-device link"), "rename into")

    monkeypatch.setattr(publish, "_rename2", rename2)
    with pytest.raises(UserError) as exc:
        with atomic_output_dir(out, overwrite=True) as tmp:
            (tmp / "new").write_text("new")
    assert str(out) in exc.value.message
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["old"]
    assert _leftovers(tmp_path) == []


def test_exchange_fallback_without_renameat2(tmp_path, monkeypatch):
    """Where renameat2 is missing (not glibc), publishing falls back to checked renames."""
    from tfcompile.io import publish

    monkeypatch.setattr(publish, "_renameat2", lambda: None)
    out = tmp_path / "artifact"
    with atomic_output_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with atomic_output_dir(out, overwrite=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["b"]
    assert _leftovers(tmp_path) == []


def test_overwrite_refuses_a_file(tmp_path):
    out = tmp_path / "artifact"
    out.write_text("not a dir")
    with pytest.raises(UserError, match="not a directory"):
        with atomic_output_dir(out, overwrite=True):
            pass


def test_creates_missing_parents(tmp_path):
    with atomic_output_dir(tmp_path / "a" / "b" / "out") as tmp:
        (tmp / "f").write_text("x")
    assert (tmp_path / "a" / "b" / "out" / "f").exists()


def test_unwritable_parent_is_refused_up_front(tmp_path, monkeypatch):
    # Root ignores chmod, so simulate what os.access would report to a normal user.
    monkeypatch.setattr(atomic_mod.os, "access", lambda p, mode: False)
    with pytest.raises(UserError) as exc:
        with atomic_output_dir(tmp_path / "out"):
            pytest.fail("body must not run")
    assert str(tmp_path) in exc.value.message and exc.value.hint


def test_mkdtemp_failure_names_parent(tmp_path, monkeypatch):
    def fail(**kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(atomic_mod.tempfile, "mkdtemp", fail)
    with pytest.raises(UserError) as exc:
        with atomic_output_dir(tmp_path / "out"):
            pass
    assert str(tmp_path) in exc.value.message and "permission" in exc.value.hint


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES])
def test_write_error_mid_shard_cleans_up(tmp_path, monkeypatch, err):
    """ENOSPC/EACCES in the middle of a shard: UserError naming the shard, no temp dir left."""
    real_open = writer_mod.OutputFile

    class Full:
        def __init__(self, f):
            self.f, self.budget = f, 64

        def write(self, data):
            n = memoryview(data).nbytes
            if n > self.budget:
                raise OSError(err, os.strerror(err))
            self.budget -= n
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(writer_mod, "OutputFile", lambda p, **kw: Full(real_open(p, **kw)))
    (plan,) = plan_shards([TensorSpec("w", torch.float32, (256,))], 1 << 20)
    out = tmp_path / "artifact"
    with pytest.raises(UserError) as exc:
        with atomic_output_dir(out) as tmp:
            with ShardWriter(tmp / plan.file_name, plan) as w:
                w.write("w", torch.ones(256))
    assert "model.safetensors" in exc.value.message
    assert exc.value.hint
    assert not out.exists() and _leftovers(tmp_path) == []


def test_sha256_file_matches_hashlib(tmp_path, monkeypatch):
    path = tmp_path / "blob"
    data = os.urandom(100_000)
    path.write_bytes(data)
    monkeypatch.setattr("tfcompile.io.hashing.CHUNK_BYTES", 4096)  # exercise several chunks
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    with pytest.raises(UserError, match="missing"):
        sha256_file(tmp_path / "missing")


def test_copy_aux_files(tiny_llama, tmp_path):
    files = open_checkpoint(tiny_llama).aux_files()
    dst = tmp_path / "dst"
    dst.mkdir()
    hashes = copy_aux_files(files, dst)
    assert list(hashes) == sorted(p.name for p in files)
    for src in files:
        copied = dst / src.name
        assert copied.read_bytes() == src.read_bytes() and not copied.is_symlink()
        assert hashes[src.name] == sha256_file(src)


def test_copy_aux_files_follows_symlinks_and_refuses_clobber(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    os.symlink(tmp_path / "real.json", tmp_path / "tokenizer.json")
    dst = tmp_path / "dst"
    dst.mkdir()
    copy_aux_files([tmp_path / "tokenizer.json"], dst)
    assert not (dst / "tokenizer.json").is_symlink()
    with pytest.raises(UserError) as exc:
        copy_aux_files([tmp_path / "tokenizer.json"], dst)  # already there
    assert "tokenizer.json" in exc.value.message
    with pytest.raises(UserError, match="cannot read"):
        copy_aux_files([tmp_path / "absent.json"], dst)
