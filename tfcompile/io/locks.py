"""Who owns a temp dir, whether that run is still alive, and one lock per output directory.

Every temp dir a run makes carries an *owner token* in its name,
`h<host>-b<boot>-p<pid>-s<start>`: a hash of the host name, the kernel's boot
id, the pid and the process start time (clock ticks since boot, from
/proc/<pid>/stat). A later run judges a temp dir stale when its owner is on
this host and either the boot id changed (a reboot ended every run), no
process has that pid, or the process with that pid started at another time
(the pid was reused). A temp dir of another host (a shared file system) is
never deleted: whether that run is alive cannot be known from here; it is
reported instead.

`output_lock(out)` holds an exclusive `flock` on `.<name>.lock` beside OUT for
the whole run, so a second run on the same OUT fails at its start with the
holder's host, pid and start time. The kernel drops the lock when the holder
dies, even by SIGKILL, so a lock file left behind never blocks anyone. The
file is unlinked by its holder on release; a waiter that opened the old file
re-checks that the path still names the inode it locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tfcompile.errors import UserError
from tfcompile.io.oserrors import write_error

_TOKEN = re.compile(r"h(?P<host>[0-9a-f]{8})-b(?P<boot>[0-9a-f]{8})-p(?P<pid>\d+)-s(?P<start>\d+)")


@dataclass(frozen=True)
class Owner:
    host: str  # first 8 hex digits of sha256(hostname)
    boot: str  # first 8 hex digits of the kernel boot id ("00000000" when unknown)
    pid: int
    start: int  # process start time in clock ticks since boot (0 when unknown)


def host_hash(name: str | None = None) -> str:
    return hashlib.sha256((name or socket.gethostname()).encode()).hexdigest()[:8]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8] or "0" * 8
    except OSError:
        return "0" * 8


def process_start(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None if no such process (0: unknown here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return 0 if _pid_exists(pid) else None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
    return int(fields[19])  # field 22 of proc(5)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_token(pid: int | None = None) -> str:
    """This host's token for `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"h{host_hash()}-b{_boot_id()}-p{pid}-s{process_start(pid) or 0}"


def parse_owner(text: str) -> Owner | None:
    m = _TOKEN.search(text)
    if m is None:
        return None
    return Owner(m["host"], m["boot"], int(m["pid"]), int(m["start"]))


def is_alive(owner: Owner) -> bool | None:
    """True / False for a run on this host; None when it ran on another host (unknowable)."""
    if owner.host != host_hash():
        return None
    if owner.boot != _boot_id():
        return False
    start = process_start(owner.pid)
    if start is None:
        return False
    return start == 0 or owner.start == 0 or start == owner.start


def sweep_stale(out: Path) -> list[str]:
    """Delete the temp dirs dead runs left beside output `out` (`.<name>.tmp-<token>-...`).

    Returns notes about temp dirs kept because their owner ran on another host."""
    out = Path(out).absolute()
    return sweep_stale_in(out.parent, f".{out.name}.tmp-")


def sweep_stale_in(parent: Path, prefix: str) -> list[str]:
    """Delete every `<prefix><token>...` entry of `parent` whose owner is dead (see the module doc)."""
    notes = []
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return notes
    for name in entries:
        if not name.startswith(prefix):
            continue
        owner = parse_owner(name[len(prefix):])
        if owner is None or not name[len(prefix):].startswith("h"):
            continue  # not made by this scheme: not ours to judge
        alive = is_alive(owner)
        if alive is None:
            notes.append(f"{Path(parent) / name} was left by a run on another host; remove it if no run is "
                         "going on there")
        elif not alive:
            shutil.rmtree(Path(parent) / name, ignore_errors=True)
    return notes


# Working dirs a run makes (each name: prefix + owner token + random): GPTQ's Hessian spill in
# $TMPDIR, rotate's rotated copy and distill's weights beside OUT (or in $TMPDIR without one)
WORK_PREFIXES = ("tfcompile-hessians-", ".tfcompile-rotate-", ".tfcompile-distill-")


def work_dir(prefix: str, parent: Path | None = None) -> tempfile.TemporaryDirectory:
    """A working dir `<prefix><owner token>-XXXX` in `parent` (default $TMPDIR), removed on cleanup;
    if the run is killed, the next run's `sweep_work_dirs` removes it."""
    assert prefix in WORK_PREFIXES, prefix
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{owner_token()}-", dir=parent)


def sweep_work_dirs(*parents: Path | None) -> list[str]:
    """Delete the working dirs of dead runs in $TMPDIR and `parents` (OUT's parent); every run does
    this at its start, whatever it runs. Notes as sweep_stale_in."""
    notes = []
    for parent in dict.fromkeys([Path(tempfile.gettempdir()), *(Path(p) for p in parents if p is not None)]):
        for prefix in WORK_PREFIXES:
            notes += sweep_stale_in(parent, prefix)
    return notes


def lock_path(out: Path) -> Path:
    out = Path(out).absolute()
    return out.parent / f".{out.name}.lock"


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[Path]:
    """Hold the lock of output `out` (its parent must exist); UserError if another run holds it."""
    path = lock_path(out)
    fd = _acquire(path, out)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it: a waiter re-checks the inode
        os.close(fd)


def _acquire(path: Path, out: Path) -> int:
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise write_error(path, e, "create the lock file") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UserError(f"another tfcompile run ({holder}) is writing {out}",
                            hint=f"wait for it to finish, or choose another output path (lock: {path})") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise write_error(path, e, "lock") from e
            # a file system without locks: run unlocked (docs/cli.md "Safety")
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:  # the holder released and unlinked it between our open and flock: retry
            os.close(fd)
            continue
        _write_holder(fd)
        return fd
    raise UserError(f"cannot take the lock {path}: it keeps being replaced", hint="is another run cycling on it?")


def _write_holder(fd: int) -> None:
    pid = os.getpid()
    doc = {"host": socket.gethostname(), "pid": pid, "start": process_start(pid) or 0,
           "token": owner_token(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    data = json.dumps(doc).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_holder(fd: int) -> str:
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {int(doc['pid'])} on {doc['host']}, since {doc['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that has just started"
