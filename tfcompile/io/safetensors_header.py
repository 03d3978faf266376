"""Read and validate a safetensors header ourselves, before the library sees the file.

Layout of a safetensors file:

    [8 bytes: N, little-endian u64][N bytes: UTF-8 JSON header][data section]

The header maps tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}
plus an optional "__metadata__" {str: str}. Offsets are relative to the start
of the data section; the tensors must tile it exactly (no gaps, no overlaps,
nothing after the last one), which is what the safetensors reader enforces.
Checking this here turns a corrupt or truncated download into an error that
names the file and the tensor instead of a panic from inside the library.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tfcompile.io.bounded import MAX_DEPTH, json_depth, unicode_text
from tfcompile.errors import CheckpointError
from tfcompile.io.dtypes import BITS, byte_size

# Same cap as the safetensors reader (MAX_HEADER_SIZE): a bigger length field
# is corruption, and we must not allocate what it claims.
MAX_HEADER_BYTES = 100_000_000

_REDOWNLOAD = "the file is corrupt or was cut short; download or export it again"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file, as its header describes it."""

    name: str
    dtype: str  # safetensors code, e.g. "BF16", "F8_E4M3"
    shape: tuple[int, ...]
    file: Path
    offsets: tuple[int, int]  # [begin, end) in bytes, relative to the data section

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header: tensors by name, the free-form metadata, sizes in bytes."""

    file: Path
    tensors: Mapping[str, TensorInfo]  # read-only view
    metadata: Mapping[str, str]  # "__metadata__", {} when absent
    data_start: int  # 8 + header length: file offset of the data section
    file_size: int


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Parse and check the header of the safetensors file at `path`.

    Raises CheckpointError (naming the file, and the tensor when one is at
    fault) for every way the file can be malformed; reads only the header.
    """
    path = Path(path)
    raw, data_start, file_size = _read_raw_header(path)
    obj = _parse_json(path, raw)
    metadata = _parse_metadata(path, obj.pop("__metadata__", None))
    tensors = {name: _parse_entry(path, name, entry) for name, entry in obj.items()}
    _check_layout(path, tensors.values(), file_size - data_start)
    return SafetensorsHeader(
        file=path,
        tensors=MappingProxyType(tensors),
        metadata=MappingProxyType(metadata),
        data_start=data_start,
        file_size=file_size,
    )


def _fail(path: Path, message: str, hint: str = _REDOWNLOAD) -> CheckpointError:
    return CheckpointError(f"{path}: {message}", hint=hint)


def _read_raw_header(path: Path) -> tuple[bytes, int, int]:
    """Return (header bytes, data section offset, file size)."""
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if file_size < 8:
                raise _fail(path, f"not a safetensors file: {file_size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                raise _fail(path, f"header length {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
            if 8 + n > file_size:
                raise _fail(path, f"header length {n} bytes runs past the end of the {file_size}-byte file")
            raw = f.read(n)
    except OSError as e:
        raise _fail(path, f"cannot read: {e.strerror or e}", hint="check that the file exists and is readable") from e
    return raw, 8 + n, file_size


def _parse_json(path: Path, raw: bytes) -> dict[str, Any]:
    if json_depth(raw) > MAX_DEPTH:  # a tensor table is 3 deep: refuse before the parser recurses
        raise _fail(path, f"header is JSON nested deeper than {MAX_DEPTH} levels")
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as e:
        raise _fail(path, f"header is not valid UTF-8 (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise _fail(path, f"header is not valid JSON: {e.msg} at character {e.pos}") from e
    except ValueError as e:  # an integer literal over Python's 4300 digits
        raise _fail(path, f"header is not valid JSON: {str(e)[:120]}") from None
    except RecursionError:
        raise _fail(path, "header is JSON nested too deep") from None
    except _DuplicateKey as e:
        raise _fail(path, f"header lists {e.args[0]!r} twice") from e
    if not isinstance(obj, dict):
        raise _fail(path, f"header is a JSON {type(obj).__name__}, not an object")
    if not unicode_text(obj):
        raise _fail(path, "header holds a string with a lone surrogate (\\ud800...), no Unicode text")
    return obj


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _parse_metadata(path: Path, meta: Any) -> dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _fail(path, '"__metadata__" must be an object of string values')
    return meta


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _parse_entry(path: Path, name: str, entry: Any) -> TensorInfo:
    where = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise _fail(path, f"{where}: header entry is not an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        raise _fail(path, f"{where}: header entry lacks {', '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in BITS:
        raise _fail(
            path,
            f"{where}: unknown dtype {dtype!r}",
            hint=f"known dtypes: {', '.join(BITS)}; the file is corrupt or from a newer safetensors",
        )
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise _fail(path, f"{where}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise _fail(path, f"{where}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    if begin > end:
        raise _fail(path, f"{where}: data_offsets [{begin}, {end}] are out of order (begin > end)")
    shape_t = tuple(shape)
    expected = byte_size(dtype, shape_t)
    if expected != end - begin:
        size = "not a whole number of bytes" if expected is None else f"{expected} bytes"
        raise _fail(path, f"{where}: {dtype} {list(shape_t)} is {size} but data_offsets span {end - begin}")
    return TensorInfo(name=name, dtype=dtype, shape=shape_t, file=path, offsets=(begin, end))


def _check_layout(path: Path, infos: Any, data_len: int) -> None:
    """Tensors must tile [0, data_len) exactly: no overlap, no gap, no truncation."""
    pos, prev = 0, None
    for info in sorted(infos, key=lambda t: (t.offsets, t.name)):
        begin, end = info.offsets
        if begin < pos:
            raise _fail(path, f"tensor {info.name!r} at bytes [{begin}, {end}] overlaps tensor {prev!r}")
        if begin > pos:
            raise _fail(path, f"tensor {info.name!r} starts at byte {begin}, leaving a gap after byte {pos}")
        if end > data_len:
            raise _fail(
                path,
                f"file is truncated: tensor {info.name!r} ends at data byte {end} "
                f"but the data section holds only {data_len} bytes",
            )
        pos, prev = end, info.name
    if pos != data_len:
        raise _fail(path, f"{data_len - pos} unexpected bytes after the last tensor")
