"""OutputFile writes exactly the bytes given, with O_DIRECT or without."""

from __future__ import annotations

import fcntl
import os

import pytest

from tfcompile.io import direct
from tfcompile.io.direct import ALIGN, CHUNK, OutputFile


@pytest.mark.parametrize("sizes", [[0], [1], [ALIGN], [CHUNK], [CHUNK + 1], [3, CHUNK - 2, 5, ALIGN * 3 + 7],
                                   [CHUNK * 2 + 123]])
@pytest.mark.parametrize("use_direct", [True, False])
def test_bytes_round_trip(tmp_path, sizes, use_direct):
    parts = [os.urandom(n) for n in sizes]
    path = tmp_path / "f.bin"
    f = OutputFile(path, direct=use_direct)
    for p in parts:
        f.write(p)
    f.close()
    assert path.read_bytes() == b"".join(parts)


def test_falls_back_where_o_direct_is_refused(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, mode=0o777):
        if flags & direct.O_DIRECT:
            raise OSError(22, "Invalid argument")  # what tmpfs answers
        return real_open(path, flags, mode)

    monkeypatch.setattr(direct.os, "open", no_direct)
    f = OutputFile(tmp_path / "g.bin")
    assert not f.direct
    f.write(b"abc" * 5000)
    f.close()
    assert (tmp_path / "g.bin").read_bytes() == b"abc" * 5000


def test_short_unaligned_direct_write_finishes_buffered(tmp_path, monkeypatch):
    real_write = os.write
    calls = {"n": 0}

    def short(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:  # the kernel may write less than asked: 100 bytes, unaligned
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~direct.O_DIRECT)  # (O_DIRECT can't write 100 bytes)
            n = real_write(fd, bytes(memoryview(data)[:100]))
            fcntl.fcntl(fd, fcntl.F_SETFL, fl)
            return n
        return real_write(fd, data)

    f = OutputFile(tmp_path / "h.bin")
    if not f.direct:
        pytest.skip("this file system has no O_DIRECT")
    monkeypatch.setattr(direct.os, "write", short)
    payload = os.urandom(CHUNK + 10)
    f.write(payload)
    f.close()
    assert (tmp_path / "h.bin").read_bytes() == payload


@pytest.mark.parametrize("use_direct", [True, False])
def test_hasher_sees_the_file_bytes_in_order(tmp_path, use_direct):
    import hashlib

    parts = [os.urandom(n) for n in (5, CHUNK - 3, 2 * CHUNK + 17, 1, ALIGN)]
    h = hashlib.sha256()
    path = tmp_path / "h.bin"
    f = OutputFile(path, direct=use_direct, hasher=h)
    for p in parts:
        f.write(memoryview(p))
    f.close()
    assert h.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("fail_at", [1, 2])
def test_error_in_the_io_thread_reaches_the_caller(tmp_path, monkeypatch, fail_at):
    import errno

    real_write = os.write
    calls = {"n": 0}

    def full(fd, data):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    f = OutputFile(tmp_path / "full.bin")
    if not f.direct:
        pytest.skip("this file system has no O_DIRECT")
    monkeypatch.setattr(direct.os, "write", full)
    with pytest.raises(OSError) as exc:
        for _ in range(4):  # the failed chunk write surfaces at a later write or at close
            f.write(bytes(CHUNK))
        f.close()
    assert exc.value.errno == errno.ENOSPC
    f.abort()  # releases the descriptor and the I/O thread; no second error
    assert f.closed
