"""Turn an OSError met while writing output into a UserError with a useful hint."""

from __future__ import annotations

import errno
import os

from tfcompile.errors import UserError

_HINTS = {
    errno.ENOSPC: "the disk is full; free space or choose another output directory",
    errno.EDQUOT: "the disk quota is exhausted; free space or choose another output directory",
    errno.EACCES: "permission denied; choose a directory you can write to",
    errno.EPERM: "operation not permitted; choose a directory you can write to",
    errno.EROFS: "the file system is read-only; choose another output directory",
    errno.EEXIST: "the file already exists; write into a new, empty directory",
}


def write_error(path: str | os.PathLike, e: OSError, action: str = "write") -> UserError:
    """UserError naming `path`, with a hint chosen from the errno of `e`."""
    hint = _HINTS.get(e.errno or -1, "check free disk space and permissions of the output directory")
    return UserError(f"cannot {action} {os.fspath(path)}: {e.strerror or e}", hint=hint)
