"""Bounded input: a file the user or a checkpoint names is read only if it is a regular file
under a size limit, and JSON only under a nesting limit.

`read_regular(path, what, limit)` opens the path without blocking, then refuses (UserError, exit 1, naming
the file and `what` it is) anything but a regular file: a FIFO would block the open forever,
/dev/zero or /dev/urandom would be read until memory runs out. It then reads at most
`limit` + 1 bytes, so a file that grows meanwhile cannot exceed the limit either.
`parse_json(text, where)` refuses JSON nested deeper than MAX_DEPTH (Python's parser would
end in RecursionError near 1000) before parsing it, and an integer literal longer than
Python's 4300 digits (a ValueError that is no JSONDecodeError), and strings that hold
lone surrogates (`"\\ud800"`: no UTF-8 writer takes them). `load_json(path, what)` is
the two together: every JSON file tfcompile reads goes through one of them. The limits (docs/cli.md "Safety"):
MAX_DEPTH 64 levels; SMALL 16 MiB for config.json, index files, recipes, eval documents;
KEY 64 KiB for key files. Safetensors headers have their own limit (safetensors_header.py).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from tfcompile.errors import UserError

MAX_DEPTH = 64  # nesting of arrays and objects in any JSON document tfcompile reads
SMALL = 16 << 20  # config.json, index files, recipes, eval documents, manifests, tuning tables
KEY = 64 << 10  # key files and manifest.sig
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def read_regular(path: str | os.PathLike, what: str, limit: int = SMALL) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes; UserError otherwise."""
    path = Path(path)
    try:  # O_NONBLOCK: opening a FIFO returns at once (a plain open would wait for a writer forever)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or type(e).__name__}",
                        hint=f"pass the path of an existing, readable {what}") from None
    st = os.fstat(fd)  # of what was opened: no window for a swap after the check
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"cannot read {what} {path}: not a regular file (a FIFO, device or directory)",
                        hint="pass the path of a regular file; tfcompile does not read pipes or devices")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise UserError(f"{what} {path} is {st.st_size:,} bytes, over the {limit:,}-byte limit",
                            hint=f"a {what} is far smaller; check the path")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UserError(f"cannot read {what} {path}: {e.strerror or type(e).__name__}",
                            hint="check the file's permissions") from None
    if len(data) > limit:
        raise UserError(f"{what} {path} grew over the {limit:,}-byte limit while it was read",
                        hint="point at a file nothing is writing to")
    return data


def json_depth(data: bytes | str) -> int:
    """The deepest nesting of arrays and objects in `data` (strings skipped; linear time)."""
    raw = data.encode() if isinstance(data, str) else data
    depth = deepest = 0
    for ch in _STRING.sub(b"", raw).translate(None, b" \t\r\n,:0123456789.eE+-truefalsn"):
        if ch in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in b"]}":
            depth -= 1
    return deepest


def parse_json(data: bytes | str, where: str, error=UserError, hint: str = "fix the file") -> Any:
    """json.loads(data) if it nests at most MAX_DEPTH deep; `error` (a UserError class) naming
    `where` otherwise, or when it is not JSON."""
    if json_depth(data) > MAX_DEPTH:
        raise error(f"{where}: JSON nested deeper than {MAX_DEPTH} levels", hint=hint)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, a 5000-digit integer
        raise error(f"{where}: not valid JSON ({str(e)[:200]})", hint=hint) from None
    if not unicode_text(doc):
        raise error(f"{where}: not valid JSON (a string holds a lone surrogate such as \\ud800, "
                    "which is no Unicode text)", hint=hint)
    return doc


def unicode_text(doc: Any) -> bool:
    """Whether every string in a parsed document is Unicode text. JSON's \\ud800 escapes parse
    into lone surrogates, which no UTF-8 writer takes (the report page, a manifest, a terminal)."""
    try:
        json.dumps(doc, ensure_ascii=False, allow_nan=True).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_json(path: str | os.PathLike, what: str, error=UserError, hint: str = "fix the file",
              limit: int = SMALL) -> Any:
    """The JSON in `path`: a regular file of at most `limit` bytes, nested at most MAX_DEPTH
    deep; `error` (a UserError class) naming the file and `what` it is otherwise."""
    try:
        data = read_regular(path, what, limit)
    except UserError as e:
        raise error(e.message, hint=e.hint) from None
    return parse_json(data, f"{what} {path}", error=error, hint=hint)


__all__ = ["KEY", "MAX_DEPTH", "SMALL", "json_depth", "load_json", "parse_json", "read_regular",
           "unicode_text"]
