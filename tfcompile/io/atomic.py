"""Build an output directory so that it appears complete or not at all.

`atomic_output_dir(out)` yields a hidden temporary sibling `.{name}.tmp-XXXX`
(same parent, hence same file system, so the final rename is atomic), with the
mode a plain `mkdir` gives under the current umask (not mkdtemp's 0700). When
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
from typing import Iterator

from tfcompile.errors import UserError
from tfcompile.io.oserrors import write_error


@contextmanager
def atomic_output_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp dir to fill; publish it as `out` only if the block succeeds."""
    out = Path(out).absolute()
    _check_target(out, overwrite)
    tmp = _mkdtemp(out.parent, f".{out.name}.tmp-")
    _chmod_like_mkdir(tmp)  # mkdtemp makes it 0700; the published directory follows the umask
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


def _chmod_like_mkdir(path: Path) -> None:
    """Give `path` the mode `mkdir` would (0777 minus the umask, e.g. 0755): a server running as
    another user must be able to read the artifact. Files inside are created with open() and
    already follow the umask."""
    mask = current_umask()
    try:
        os.chmod(path, 0o777 & ~mask)
    except OSError as e:
        shutil.rmtree(path, ignore_errors=True)
        raise write_error(path, e, "set the permissions of") from e


def current_umask() -> int:
    """The process umask, read without changing it (Linux /proc) when possible: os.umask's
    set-and-restore would briefly apply umask 0 to files other threads create."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
