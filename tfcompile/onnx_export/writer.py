"""Initializers streamed from the artifact's safetensors into the ONNX output.

Every quantized tensor goes into the graph with the bytes the artifact holds
(packed E2M1 pairs, E4M3 codes, E8M0 codes, bf16 norms): `TensorSink.add`
takes a memory-mapped torch view and appends its bytes to the external data
file (`<model>.onnx.data`; each tensor 64-byte aligned, 4096 from 1 MiB on so
runtimes can map it); the TensorProto only points at them. Below the inline
limit, inline.py later folds the file into the .onnx, streaming too. The sink
hashes what it writes, so the data file's sha256 needs no second read.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from onnx import TensorProto

_PAGE_FROM = 1 << 20  # tensors of 1 MiB and more start on a 4096-byte boundary
_TORCH_TO_ONNX = {torch.bfloat16: TensorProto.BFLOAT16, torch.float16: TensorProto.FLOAT16,
                  torch.float32: TensorProto.FLOAT, torch.float8_e4m3fn: TensorProto.FLOAT8E4M3FN,
                  torch.uint8: TensorProto.UINT8}


def onnx_type(dtype: torch.dtype) -> int:
    """The TensorProto element type that holds a torch tensor's bytes unchanged."""
    return _TORCH_TO_ONNX[dtype]


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """A uint8 view of `t`'s bytes (no copy for the contiguous memory-mapped views we get)."""
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)


class TensorSink:
    """Appends initializer bytes to one external data file and returns TensorProtos pointing at them."""

    def __init__(self, data_path: Path):
        self.data_path = data_path
        self._f = open(data_path, "wb")
        self._sha = hashlib.sha256()
        self.offset = 0
        self.bytes = 0  # initializer payload bytes written

    def add(self, name: str, elem_type: int, dims: list[int], t: torch.Tensor) -> TensorProto:
        """An initializer `name` of ONNX type `elem_type` and shape `dims` holding `t`'s bytes."""
        raw = tensor_bytes(t)
        tp = TensorProto(name=name, data_type=elem_type, dims=list(dims))
        self.bytes += raw.nbytes
        align = 4096 if raw.nbytes >= _PAGE_FROM else 64
        pad = -self.offset % align
        if pad:
            self._write(b"\0" * pad)
        tp.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", self.offset), ("length", raw.nbytes)):
            entry = tp.external_data.add()
            entry.key, entry.value = key, str(value)
        self._write(raw)
        return tp

    def _write(self, buf) -> None:
        self._f.write(buf)
        self._sha.update(buf)
        self.offset += len(memoryview(buf).cast("B"))

    def close(self) -> str:
        """Flush, fsync and close the data file; returns its sha256."""
        self._f.flush()
        os.fsync(self._f.fileno())  # the file is published by a rename; make its bytes durable first
        self._f.close()
        self._f = None
        return self._sha.hexdigest()

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
