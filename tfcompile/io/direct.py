"""An append-only output file that bypasses the page cache where it can.

Measured on this project's build machines (ext4 on a virtio disk): buffered
writes of a 1.6 GB shard run at ~0.44 GB/s, almost all of it kernel CPU time
copying into the page cache; O_DIRECT writes of the same bytes run at
~2.2 GB/s and leave the CPU to quantization. O_DIRECT needs the buffer
address, length and file offset aligned (4 KiB here), so bytes are staged in
an aligned 8 MiB buffer and written in whole chunks; the unaligned tail is
written after switching O_DIRECT off. File systems without O_DIRECT (tmpfs)
give EINVAL at open, and then the file is written the ordinary way.
"""

from __future__ import annotations

import errno
import fcntl
import os

import numpy as np

ALIGN = 4096
CHUNK = 8 << 20  # staging buffer, a multiple of ALIGN
O_DIRECT = getattr(os, "O_DIRECT", 0)


class OutputFile:
    """`write(bytes-like)` appends; `close(fsync=True)` flushes, syncs and closes."""

    def __init__(self, path: str | os.PathLike, direct: bool = True):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.direct = bool(direct and O_DIRECT)
        try:
            self.fd = os.open(path, flags | (O_DIRECT if self.direct else 0), 0o644)
        except OSError as e:
            if not self.direct or e.errno != errno.EINVAL:
                raise
            self.direct = False
            self.fd = os.open(path, flags, 0o644)
        self.closed = False
        self._fill = 0
        if self.direct:
            raw = np.empty(CHUNK + ALIGN, dtype=np.uint8)
            skip = -raw.ctypes.data % ALIGN  # first aligned byte of the allocation
            self._buf = memoryview(raw[skip: skip + CHUNK])

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        if not self.direct:
            self._write_all(mv)
            return
        while len(mv):
            n = min(CHUNK - self._fill, len(mv))
            self._buf[self._fill: self._fill + n] = mv[:n]
            self._fill += n
            mv = mv[n:]
            if self._fill == CHUNK:
                self._write_all(self._buf)
                self._fill = 0

    def close(self, fsync: bool = True) -> None:
        if self.closed:
            return
        try:
            if self._fill:  # staged bytes: whole aligned blocks directly, then the tail
                whole = self._fill // ALIGN * ALIGN if self.direct else 0
                if whole:
                    self._write_all(self._buf[:whole])
                if self.direct:
                    self._buffered()
                self._write_all(self._buf[whole: self._fill])
                self._fill = 0
            if fsync:
                os.fsync(self.fd)
        finally:
            self.closed = True
            os.close(self.fd)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def _buffered(self) -> None:
        """Turn O_DIRECT off for what is left (an unaligned tail)."""
        fl = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fl & ~O_DIRECT)
        self.direct = False

    def _write_all(self, mv: memoryview) -> None:
        while len(mv):
            n = os.write(self.fd, mv)
            if n < len(mv) and self.direct and n % ALIGN:
                self._buffered()  # a short, unaligned direct write: finish the ordinary way
            mv = mv[n:]
