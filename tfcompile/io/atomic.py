"""Build an output directory so that it appears complete or not at all.

`atomic_output_dir(out)` yields a hidden temporary sibling `.{name}.tmp-XXXX`
(same parent, hence same file system, so the final rename is atomic). When
the block finishes, the temp dir is renamed to `out`; when it raises anything,
KeyboardInterrupt included, the temp dir is deleted and the error re-raised.
With `overwrite`, the old `out` is first renamed aside, the new one renamed in,
then the old one deleted; if the swap fails the old one is put back.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from tfcompile.errors import UserError
from tfcompile.io.oserrors import write_error


@contextmanager
def atomic_output_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp dir to fill; publish it as `out` only if the block succeeds."""
    out = Path(out).absolute()
    _check_target(out, overwrite)
    tmp = _mkdtemp(out.parent, f".{out.name}.tmp-")
    try:
        yield tmp
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_target(out: Path, overwrite: bool) -> None:
    """Refuse up front what would fail late: an existing `out`, an unwritable parent."""
    if os.path.lexists(out):
        if not overwrite:
            raise UserError(f"{out} already exists", hint="pass --overwrite to replace it, or choose another path")
        if not out.is_dir():
            raise UserError(f"{out} exists and is not a directory", hint="remove it or choose another output path")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(parent, e, "create") from e
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(
            f"cannot write into {parent}: permission denied", hint="choose an output directory you can write to"
        )


def _publish(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`, moving an existing `out` aside first and deleting it after."""
    if not os.path.lexists(out):
        _rename(tmp, out)
        _fsync_dir(out.parent)
        return
    aside_dir = _mkdtemp(out.parent, f".{out.name}.old-")
    aside = aside_dir / out.name
    try:
        _rename(out, aside)
    except BaseException:
        aside_dir.rmdir()
        raise
    try:
        _rename(tmp, out)
    except BaseException:
        os.rename(aside, out)  # put the old output back before reporting
        aside_dir.rmdir()
        raise
    _fsync_dir(out.parent)
    shutil.rmtree(aside_dir, ignore_errors=True)


def _mkdtemp(parent: Path, prefix: str) -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except OSError as e:
        raise write_error(parent, e, "create a directory in") from e


def _rename(src: Path, dst: Path) -> None:
    try:
        os.rename(src, dst)
    except OSError as e:
        raise write_error(dst, e, "rename into") from e


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


@contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write that replaces `path` whole or not at all: a temp sibling is
    written (and fsynced), then renamed over `path` when the block ends; if the block raises,
    the temp file is removed and `path` is untouched. For files rewritten in place (a tuning
    table in a published artifact, a resume checkpoint, a cache entry); files of a staging
    directory need no such care (the directory is published atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: bytes, *, fsync: bool = True) -> None:
    """Replace the file at `path` with `data` whole or not at all (`atomic_file`)."""
    with atomic_file(path, fsync=fsync) as f:
        f.write(data)
