"""SHA-256 of files, read in fixed chunks so memory stays flat for any size."""

from __future__ import annotations

import hashlib
import os

from tfcompile.errors import UserError

CHUNK_BYTES = 8 << 20  # 8 MiB: large enough to amortize syscalls, small enough to not matter


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file at `path`; UserError naming it when unreadable."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                h.update(chunk)
    except OSError as e:
        raise UserError(
            f"cannot read {os.fspath(path)}: {e.strerror or e}", hint="check that the file exists and is readable"
        ) from e
    return h.hexdigest()


def sha256_bytes(data: bytes | str) -> str:
    """Hex SHA-256 of `data` (a str is hashed as UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()
