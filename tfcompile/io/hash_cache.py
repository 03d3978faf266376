"""sha256 of source files, remembered across runs by file identity.

Release pipelines quantize one checkpoint into several formats; hashing a
100 GB source every time costs minutes of CPU (sha256 runs at ~1.7 GB/s per
core here). Like git's index, we key a remembered digest on (real path,
device, inode, size, mtime_ns, ctime_ns): any write to the file changes
mtime/ctime, so a stale digest is never reused by an ordinary modification.
The cache lives in $TFCOMPILE_CACHE (default ~/.cache/tfcompile)/sha256.json,
written atomically; a missing or corrupt cache is simply rebuilt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tfcompile.io.atomic import write_atomic
from tfcompile.io.hashing import sha256_file
from tfcompile.settings import settings

MAX_ENTRIES = 4096


def cache_path() -> Path:
    return settings().sha256_cache


def _key(path: Path) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def _load(cpath: Path) -> dict[str, str]:
    try:
        data = json.loads(cpath.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _store(cpath: Path, entries: dict[str, str]) -> None:
    try:
        items = list(entries.items())[-MAX_ENTRIES:]
        write_atomic(cpath, json.dumps(dict(items)).encode(), fsync=False)
    except OSError:
        pass  # a cache we cannot write only costs time next run


def sha256_files_cached(files: list[Path], *, use_cache: bool = True) -> dict[Path, str]:
    """{file: hex sha256}; files whose identity is unchanged since last time are not re-read."""
    cpath = cache_path()
    entries = _load(cpath) if use_cache else {}
    out, changed = {}, False
    for f in files:
        key = _key(f)
        digest = entries.get(key)
        if digest is None:
            digest = sha256_file(f)
            entries.pop(key, None)
            entries[key] = digest
            changed = True
        out[f] = digest
    if use_cache and changed:
        _store(cpath, entries)
    return out
