"""Turn an OSError met while writing output into a UserError with a useful hint."""

from __future__ import annotations

import errno
import os
import re

from tfcompile.errors import UserError

_HINTS = {
    errno.ENOSPC: "the disk is full; free space or choose another output directory",
    errno.EDQUOT: "the disk quota is exhausted; free space or choose another output directory",
    errno.EACCES: "permission denied; choose a directory you can write to",
    errno.EPERM: "operation not permitted; choose a directory you can write to",
    errno.EROFS: "the file system is read-only; choose another output directory",
    errno.EEXIST: "the file already exists; write into a new, empty directory",
    errno.ENAMETOOLONG: "a file or directory name is too long for the file system (most allow 255 bytes per "
                        "name, including the suffixes tfcompile adds); use a shorter name",
    errno.ELOOP: "too many levels of symbolic links; use the real path",
}
_OS_CODE = re.compile(r"os error (\d+)")


def write_error(path: str | os.PathLike, e: OSError, action: str = "write", where: str = "") -> UserError:
    """UserError naming `path`, with a hint chosen from the errno of `e` (`where`: what to add to it)."""
    hint = _HINTS.get(e.errno or -1, "check free disk space and permissions of the output directory")
    return UserError(f"cannot {action} {os.fspath(path)}: {e.strerror or e}", hint=hint + (f"; {where}" if where else ""))


def as_os_error(e: BaseException, path: str | os.PathLike) -> OSError | None:
    """The OSError behind `e`: `e` itself, or the "os error N" a Rust library reports in its message
    (safetensors' SafetensorError on a full disk); None when `e` is no I/O failure."""
    if isinstance(e, OSError):
        return e
    m = _OS_CODE.search(str(e))
    return OSError(int(m[1]), os.strerror(int(m[1])), os.fspath(path)) if m else None
