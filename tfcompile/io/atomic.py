"""Build an output directory so that it appears complete or not at all.

`atomic_output_dir(out)`:
1. refuses an OUT whose replacement could lose data (tfcompile/io/publish.py:
   MODEL, an ancestor of it, the current directory ...; `protect` names MODEL);
2. creates missing parents (removed again if the run fails), takes the lock
   of OUT (tfcompile/io/locks.py: a concurrent run on OUT fails here), and
   deletes temp dirs that dead runs left beside OUT;
3. refuses an existing OUT unless `overwrite`, recording which directory it is;
4. yields a hidden temp sibling `.{name}.tmp-<owner>-XXXX` (same parent, so the
   same file system: the final rename is atomic) to fill, with the mode a plain
   `mkdir` gives under the current umask (not mkdtemp's 0700: a server running
   as another user must read the artifact);
5. when the block succeeds, publishes it with one rename (no-replace, or an
   exchange with the OUT recorded in step 3), failing with exit 1 and touching
   nothing if another OUT appeared meanwhile; when the block raises anything,
   KeyboardInterrupt and SIGTERM included, deletes the temp dir and re-raises.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from tfcompile.errors import UserError
from tfcompile.io import locks, publish, signals
from tfcompile.io.oserrors import write_error


@contextmanager
def atomic_output_dir(out: str | os.PathLike, overwrite: bool = False, *, protect: tuple = (),
                      warn: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Yield a temp dir to fill; publish it as `out` only if the block succeeds."""
    publish.check_output_path(Path(out), tuple(Path(p) for p in protect), overwrite=overwrite)
    out = Path(out).absolute()
    created = _make_parents(out.parent)
    try:
        with locks.output_lock(out):
            for note in locks.sweep_stale(out):
                (warn or (lambda m: None))(note)
            expected = _check_target(out, overwrite)
            tmp = _mkdtemp(out.parent, f".{out.name}.tmp-{locks.owner_token()}-")
            _chmod_like_mkdir(tmp)  # mkdtemp makes it 0700; the published directory follows the umask
            try:
                yield tmp
                _publish(tmp, out, expected)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except BaseException:
        _remove_empty(created)
        raise


def _publish(tmp: Path, out: Path, expected: tuple[int, int, int] | None) -> None:
    """Publish with SIGINT/SIGTERM held back; one that came meanwhile still ends the run (exit 130/143),
    and says OUT was written."""
    done = False
    try:
        with signals.deferred():
            publish.publish(tmp, out, expected)
            done = True
    except signals.Terminated as e:
        e.published = out if done else None
        raise


def _check_target(out: Path, overwrite: bool) -> tuple[int, int, int] | None:
    """Refuse up front what would fail late; the identity of the OUT `overwrite` may replace."""
    if os.path.lexists(out):
        if not overwrite:
            raise UserError(f"{out} already exists", hint="pass --overwrite to replace it, or choose another path")
        if not out.is_dir():
            raise UserError(f"{out} exists and is not a directory", hint="remove it or choose another output path")
    parent = out.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(
            f"cannot write into {parent}: permission denied", hint="choose an output directory you can write to"
        )
    return publish.identity(out)


def _make_parents(parent: Path) -> list[Path]:
    """mkdir -p `parent`; the directories it created, deepest first."""
    missing = []
    p = parent
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_empty(missing)
        raise write_error(parent, e, "create") from e
    return missing


def _remove_empty(dirs: list[Path]) -> None:
    for d in dirs:  # deepest first; a directory someone else filled meanwhile stays
        with contextlib.suppress(OSError):
            d.rmdir()


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


@contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write that replaces `path` whole or not at all: a temp sibling is
    written (and fsynced), then renamed over `path` when the block ends; if the block raises,
    the temp file is removed and `path` is untouched. The file gets the mode `open()` would give
    (0666 minus the umask; mkstemp's is 0600). For files rewritten in place (the manifest, a
    tuning table in a published artifact, a resume checkpoint, a cache entry) and files a
    reader may open while they are written (a lock's owner record); OSError propagates
    (callers that report it to the user wrap it with `tfcompile.io.oserrors.write_error`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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
