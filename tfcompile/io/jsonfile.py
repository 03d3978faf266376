"""Deterministic JSON files: the one writer of every JSON document tfcompile stores.

`dumps(doc)` is sorted keys, 2-space indent, ASCII, a trailing newline: the same document
gives the same bytes on any machine, which is what byte-identical artifacts rest on.
`write_json(path, doc)` writes it (atomically with `atomic=True`, for files rewritten in
place) and returns its sha256, the value the manifest records. A write that fails (disk
full, quota, read-only) is a UserError naming the file (`tfcompile.io.oserrors`), exit 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Union

from tfcompile.io.atomic import write_atomic
from tfcompile.io.hashing import sha256_bytes
from tfcompile.io.oserrors import write_error

# What a stored JSON document holds (manifest sections, launch records, pass statistics).
JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
JsonDict = dict[str, JsonValue]


def dumps(doc: Any) -> bytes:
    """The document as stored: sorted keys, indent 2, ASCII, trailing newline."""
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def write_bytes(path: str | os.PathLike, data: bytes, *, atomic: bool = False) -> str:
    """Write `data` to `path` (parents created); returns its sha256."""
    path = Path(path)
    try:
        if atomic:
            write_atomic(path, data)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    except OSError as e:
        raise write_error(path, e) from e
    return sha256_bytes(data)


def write_json(path: str | os.PathLike, doc: Any, *, atomic: bool = False) -> str:
    """Write `doc` with `dumps` to `path`; returns the file's sha256."""
    return write_bytes(path, dumps(doc), atomic=atomic)
