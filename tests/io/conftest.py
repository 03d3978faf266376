"""Fixtures for tests/io, on top of tests/conftest.py (`model_factory`, `tiny_llama`)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _llama_sharded_src(model_factory, tmp_path_factory) -> Path:
    return model_factory.make_tiny_llama(tmp_path_factory.mktemp("llama3") / "tiny-llama-sharded", shards=3)


@pytest.fixture()
def llama_sharded_dir(_llama_sharded_src, tmp_path) -> Path:
    """A private copy of a tiny Llama saved in several shards with an index."""
    return Path(shutil.copytree(_llama_sharded_src, tmp_path / "sharded"))


def write_raw_safetensors(path: Path, header: object, data: bytes = b"", *, raw_header: bytes | None = None) -> Path:
    """Write a safetensors file from a header object (or raw header bytes) and data."""
    body = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


@pytest.fixture()
def raw_safetensors():
    """The `write_raw_safetensors` helper, for building malformed files."""
    return write_raw_safetensors
