"""Write a model whose initializers live in an external data file as ONE .onnx file, streaming.

onnx.save_model would first load every tensor into the ModelProto and then
serialize it into one more bytes object (2-3x the weights in memory, 5.7x
measured with the checker on top). The protobuf wire format lets us do
better: a length-delimited field is `tag, varint(length), bytes`, and
parsers accept fields in any order. So we serialize the proto without its
initializers, compute every length up front, and append each initializer as
`header fields + raw_data (field 9)` copied in chunks from the data file.
Memory stays at one chunk; the result parses to the same ModelProto.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import onnx
from onnx import TensorProto

_CHUNK = 8 << 20  # bytes copied per read from the data file
_RAW_DATA, _INITIALIZER, _GRAPH = 9, 5, 7  # TensorProto.raw_data, GraphProto.initializer, ModelProto.graph


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, length: int) -> bytes:
    """Tag and length prefix of a length-delimited (wire type 2) field."""
    return _varint(number << 3 | 2) + _varint(length)


def _external(t: TensorProto) -> tuple[int, int] | None:
    if t.data_location != TensorProto.EXTERNAL:
        return None
    meta = {e.key: e.value for e in t.external_data}
    return int(meta.get("offset", 0)), int(meta["length"])


def write_inline(model: onnx.ModelProto, data_path: Path, out: Path) -> str:
    """Write `model` to `out` with every external initializer's bytes inlined; returns the sha256."""
    parts: list[tuple[bytes, tuple[int, int] | None]] = []  # (serialized head, external (offset, length))
    for t in model.graph.initializer:
        ext = _external(t)
        head = TensorProto()
        head.CopyFrom(t)
        if ext is not None:
            head.ClearField("external_data")
            head.ClearField("data_location")
        body = head.SerializeToString()
        if ext is not None:
            body += _field(_RAW_DATA, ext[1])  # the raw bytes follow, streamed from the data file
        parts.append((body, ext))
    sizes = [len(b) + (e[1] if e else 0) for b, e in parts]
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)  # small: the initializers hold references, not bytes
    graph.ClearField("initializer")
    shell = onnx.ModelProto()
    shell.CopyFrom(model)
    shell.ClearField("graph")
    graph_head = graph.SerializeToString()
    graph_len = len(graph_head) + sum(len(_field(_INITIALIZER, s)) + s for s in sizes)
    sha = hashlib.sha256()
    with open(out, "wb") as f, open(data_path, "rb") as data:
        def put(buf) -> None:
            f.write(buf)
            sha.update(buf)

        put(shell.SerializeToString() + _field(_GRAPH, graph_len) + graph_head)
        for (body, ext), size in zip(parts, sizes):
            put(_field(_INITIALIZER, size) + body)
            if ext is not None:
                _copy(data, f, put, *ext)
        f.flush()
        os.fsync(f.fileno())
    return sha.hexdigest()


def _copy(src, dst, put, offset: int, length: int) -> None:
    src.seek(offset)
    while length:
        buf = src.read(min(_CHUNK, length))
        if not buf:
            raise OSError(f"{src.name}: ends before offset {offset} + {length}")
        put(buf)
        length -= len(buf)
