"""Our safetensors header parser: valid files parse, every corruption is named."""

from __future__ import annotations

import struct

import pytest
import torch
from safetensors.torch import save_file

from tfcompile.errors import CheckpointError
from tfcompile.io.safetensors_header import MAX_HEADER_BYTES, TensorInfo, read_header


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def _expect(path, *fragments):
    """read_header(path) raises a CheckpointError naming `path`, with a hint and `fragments`."""
    with pytest.raises(CheckpointError) as exc:
        read_header(path)
    err = exc.value
    assert str(path) in err.message
    assert err.hint
    for fragment in fragments:
        assert fragment in err.message, (fragment, err.message)
    return err


def test_parses_file_written_by_safetensors(tmp_path):
    path = tmp_path / "ok.safetensors"
    save_file(
        {"a": torch.zeros(3, 4, dtype=torch.bfloat16), "s": torch.tensor(1.0), "q": torch.zeros(5, dtype=torch.uint8)},
        path,
        metadata={"format": "pt"},
    )
    header = read_header(path)
    assert header.metadata == {"format": "pt"}
    assert set(header.tensors) == {"a", "s", "q"}
    a = header.tensors["a"]
    assert isinstance(a, TensorInfo)
    assert (a.dtype, a.shape, a.file, a.nbytes) == ("BF16", (3, 4), path, 24)
    assert header.tensors["s"].shape == ()
    assert header.data_start + sum(t.nbytes for t in header.tensors.values()) == header.file_size
    with pytest.raises(Exception):
        a.name = "b"  # frozen


def test_file_shorter_than_8_bytes(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x02\x03")
    _expect(path, "shorter than the 8-byte")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    _expect(path, "0 bytes")


def test_header_length_past_end_of_file(tmp_path):
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    _expect(path, "runs past the end")


def test_header_length_over_limit(tmp_path):
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    _expect(path, "exceeds")


def test_header_not_utf8(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", None, raw_header=b'{"\xff\xfe":1}')
    _expect(path, "UTF-8")


def test_header_not_json(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", None, raw_header=b"{not json")
    _expect(path, "not valid JSON")


@pytest.mark.parametrize("header", [[1, 2], "x", 3])
def test_header_not_object(tmp_path, raw_safetensors, header):
    path = raw_safetensors(tmp_path / "h.safetensors", header)
    _expect(path, "not an object")


def test_duplicate_tensor_in_header(tmp_path, raw_safetensors):
    raw = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'
    path = raw_safetensors(tmp_path / "h.safetensors", None, b"\0\0", raw_header=raw)
    _expect(path, "'a' twice")


@pytest.mark.parametrize("missing", ["dtype", "shape", "data_offsets"])
def test_entry_missing_field(tmp_path, raw_safetensors, missing):
    entry = _entry()
    del entry[missing]
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": entry}, bytes(8))
    _expect(path, "'w'", missing)


def test_entry_not_object(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": [1, 2]}, bytes(8))
    _expect(path, "'w'", "not an object")


@pytest.mark.parametrize("dtype", ["F128", "float32", 7])
def test_unknown_dtype(tmp_path, raw_safetensors, dtype):
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": _entry(dtype=dtype)}, bytes(8))
    err = _expect(path, "'w'", "unknown dtype")
    assert "BF16" in err.hint


@pytest.mark.parametrize("shape", [[-1], [2.0], "2", [True]])
def test_bad_shape(tmp_path, raw_safetensors, shape):
    entry = _entry()
    entry["shape"] = shape
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": entry}, bytes(8))
    _expect(path, "'w'", "shape")


@pytest.mark.parametrize("offsets", [[0], [0, 8, 16], [-1, 8], ["0", "8"]])
def test_bad_offsets_form(tmp_path, raw_safetensors, offsets):
    entry = _entry()
    entry["data_offsets"] = offsets
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": entry}, bytes(8))
    _expect(path, "'w'", "data_offsets")


def test_offsets_out_of_order(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": _entry(offsets=(8, 0))}, bytes(8))
    _expect(path, "'w'", "out of order")


def test_offsets_do_not_match_dtype_and_shape(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": _entry(shape=(3,), offsets=(0, 8))}, bytes(8))
    _expect(path, "'w'", "12 bytes", "span 8")


def test_sub_byte_size_not_whole(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", {"w": _entry(dtype="F4", shape=(3,), offsets=(0, 2))}, bytes(2))
    _expect(path, "'w'", "not a whole number of bytes")


def test_overlapping_tensors(tmp_path, raw_safetensors):
    header = {"a": _entry(offsets=(0, 8)), "b": _entry(offsets=(4, 12))}
    path = raw_safetensors(tmp_path / "h.safetensors", header, bytes(12))
    _expect(path, "'b'", "overlaps", "'a'")


def test_gap_between_tensors(tmp_path, raw_safetensors):
    header = {"a": _entry(offsets=(0, 8)), "b": _entry(offsets=(12, 20))}
    path = raw_safetensors(tmp_path / "h.safetensors", header, bytes(20))
    _expect(path, "'b'", "gap")


def test_truncated_file(tmp_path, raw_safetensors):
    header = {"a": _entry(offsets=(0, 8)), "b": _entry(offsets=(8, 16))}
    path = raw_safetensors(tmp_path / "h.safetensors", header, bytes(12))
    _expect(path, "truncated", "'b'")


def test_truncated_real_file(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.ones(64, 64)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    _expect(path, "truncated", "'w'")


def test_trailing_bytes(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", {"a": _entry()}, bytes(9))
    _expect(path, "1 unexpected bytes")


def test_bad_metadata(tmp_path, raw_safetensors):
    path = raw_safetensors(tmp_path / "h.safetensors", {"__metadata__": {"k": 1}, "a": _entry()}, bytes(8))
    _expect(path, "__metadata__")


def test_unreadable_path(tmp_path):
    _expect(tmp_path / "missing.safetensors", "cannot read")


def test_zero_sized_and_empty_tensors_accepted(tmp_path, raw_safetensors):
    header = {"e": _entry(shape=(0, 4), offsets=(0, 0)), "a": _entry(offsets=(0, 8)), "z": _entry(shape=(0,), offsets=(8, 8))}
    path = raw_safetensors(tmp_path / "h.safetensors", header, bytes(8))
    assert read_header(path).tensors["e"].nbytes == 0
