"""Where an artifact may go, and the rename that publishes it.

`check_output_path(out, protect)` refuses, before anything is created, an OUT
that `--overwrite` (or the final rename) could use to destroy data: the output
policy of tfcompile/io/out_policy.py (the source, inside it or its ancestor, the
current directory, a Hugging Face cache; by file identity), with `protect`
(MODEL, and the cache `blobs/` its snapshot links into) as the sources.

`publish(tmp, out, expected)` renames the finished staging dir to OUT with
`renameat2`: RENAME_NOREPLACE when OUT did not exist at the start, so an OUT
that appeared meanwhile (a file, or a directory, even an empty one) makes the
run fail and is left untouched; RENAME_EXCHANGE when replacing an OUT that
existed at the start (`--overwrite`), after checking it is still the same
directory (device and inode), so there is no moment without an OUT and a
directory put there by someone else is never deleted. File systems without
renameat2 flags fall back to a check-then-rename (a window of microseconds
against writers other than tfcompile; tfcompile runs exclude each other with
the lock in tfcompile/io/locks.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.io import out_policy
from tfcompile.io.oserrors import write_error

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100


def check_output_path(out: Path, protect: tuple[Path, ...] = (), *, overwrite: bool = False) -> None:
    """UserError when OUT is a directory whose replacement would lose data: the one output policy
    of tfcompile/io/out_policy.py, with `protect` (MODEL, its cache blobs) as the sources."""
    out_policy.check_output(out, [("model directory", p) for p in protect], overwrite=overwrite)


def identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, ctime ns) of `path` itself (not a symlink's target), or None if absent.

    The ctime tells a new directory that reused a deleted one's inode number from the old one
    (it also changes when entries are added or removed: then OUT was written to meanwhile)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def appeared_error(out: Path) -> UserError:
    return UserError(f"{out} appeared while this run was in progress; it was left untouched and the new "
                     "artifact was discarded",
                     hint="another process wrote there: rerun with a new output path, or with --overwrite "
                          "once nothing else writes to it")


def publish(tmp: Path, out: Path, expected: tuple[int, int, int] | None) -> None:
    """Rename `tmp` to `out`. `expected`: the identity of `out` at the start (None: it did not exist)."""
    if expected is None or identity(out) is None:
        try:
            _rename2(tmp, out, RENAME_NOREPLACE)
        except FileExistsError:
            raise appeared_error(out) from None
        _fsync_dir(out.parent)
        return
    if identity(out) != expected:
        raise appeared_error(out)
    _rename2(tmp, out, RENAME_EXCHANGE)  # tmp now names the old OUT
    if (identity(tmp) or ())[:2] != expected[:2]:  # replaced between check and exchange: swap back
        # (device and inode only: the rename itself changed the old OUT's ctime)
        _rename2(tmp, out, RENAME_EXCHANGE)
        raise appeared_error(out)
    _fsync_dir(out.parent)
    if os.path.islink(tmp):  # OUT was a symlink to a directory: drop the link, never its target
        os.unlink(tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def _rename2(src: Path, dst: Path, flags: int) -> None:
    """renameat2(src, dst, flags); FileExistsError for NOREPLACE on an existing dst."""
    fn = _renameat2()
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise write_error(dst, OSError(err, os.strerror(err)), "rename into")
    _rename_fallback(src, dst, flags)


def _rename_fallback(src: Path, dst: Path, flags: int) -> None:
    """Without renameat2 flags: check, then rename (EXCHANGE through an aside name)."""
    try:
        if flags == RENAME_NOREPLACE:
            if os.path.lexists(dst):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
            os.rename(src, dst)
            return
        aside = src.with_name(src.name + ".x")
        os.rename(dst, aside)
        os.rename(src, dst)
        os.rename(aside, src)
    except FileExistsError:
        raise
    except OSError as e:
        raise write_error(dst, e, "rename into") from e


_FN: list = []


def _renameat2():
    if not _FN:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (AttributeError, OSError):  # not glibc >= 2.28 (musl, macOS)
            fn = None
        _FN.append(fn)
    return _FN[0]


def _fsync_dir(path: Path) -> None:
    """Persist a rename (best effort: some file systems refuse fsync on directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
