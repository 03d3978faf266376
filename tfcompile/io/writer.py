"""Write safetensors shards tensor by tensor, with bounded memory and fixed bytes.

The caller plans the output up front (`plan_shards`: names, dtypes, shapes),
so each shard's header, and with it every tensor's offset, is known before
any data exists. `ShardWriter` writes that header at once and then streams
each tensor straight to the file as the pipeline produces it: peak memory is
one tensor, not one shard. Output bytes depend only on the plan, metadata and
tensor values, so writing the same model twice gives identical files.

Byte layout matches what the safetensors library writes: header JSON padded
with spaces to a multiple of 8 bytes, tensors contiguous in plan order.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcompile.errors import UserError
from tfcompile.io.direct import OutputFile
from tfcompile.io.dtypes import code_of
from tfcompile.io.jsonfile import write_json
from tfcompile.io.oserrors import write_error
from tfcompile.io.paths import INDEX_FILE, SINGLE_FILE


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: name, torch dtype and shape (no data)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        code_of(self.dtype)  # ValueError now rather than halfway through a write

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class ShardPlan:
    """One output file: its name and the tensors it holds, in write order."""

    file_name: str
    specs: tuple[TensorSpec, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (the header excluded), as HF's total_size counts."""
        return sum(s.nbytes for s in self.specs)


@dataclass(frozen=True)
class ShardResult:
    """What `ShardWriter.close` reports about the finished file."""

    path: Path
    sha256: str  # hex digest of the whole file
    size: int  # bytes, header included


def plan_shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[ShardPlan]:
    """Split `specs`, in the given order, into shards of at most `max_shard_bytes` of data.

    A tensor bigger than the limit gets a shard of its own (as transformers
    does). One shard is `model.safetensors`; N shards are
    `model-00001-of-0000N.safetensors` ... plus an index (`write_index`).
    """
    if max_shard_bytes <= 0:
        raise UserError(f"max shard size must be positive, got {max_shard_bytes} bytes", hint="pass e.g. 5GB")
    seen: set[str] = set()
    groups: list[list[TensorSpec]] = [[]]
    size = 0  # data bytes in groups[-1]
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"tensor {spec.name!r} is planned twice")
        seen.add(spec.name)
        if groups[-1] and size + spec.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    n = len(groups)
    names = [SINGLE_FILE] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    return [ShardPlan(name, tuple(g)) for name, g in zip(names, groups)]


def index_json(plans: list[ShardPlan]) -> dict:
    """The HF `model.safetensors.index.json` object for a sharded plan."""
    weight_map = {s.name: p.file_name for p in plans for s in p.specs}
    return {
        "metadata": {"total_size": sum(p.nbytes for p in plans)},
        "weight_map": dict(sorted(weight_map.items())),
    }


def write_index(out_dir: str | os.PathLike, plans: list[ShardPlan]) -> Path | None:
    """Write the index next to the shards when there are several; return its path."""
    if len(plans) < 2:
        return None
    path = Path(out_dir) / INDEX_FILE
    try:
        write_json(path, index_json(plans))
    except OSError as e:
        raise write_error(path, e) from e
    return path


def encode_header(plan: ShardPlan, metadata: dict[str, str] | None = None) -> bytes:
    """Header bytes: the u64 length then JSON, space-padded to a multiple of 8.

    Keys are emitted in a fixed order (`__metadata__` first, then tensors by
    name) with compact separators, so the bytes depend only on the content.
    """
    metadata = metadata or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("safetensors metadata must map str to str")
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(sorted(metadata.items()))
    entries, pos = {}, 0
    for spec in plan.specs:  # offsets follow write order
        entries[spec.name] = {
            "dtype": code_of(spec.dtype),
            "shape": list(spec.shape),
            "data_offsets": [pos, pos + spec.nbytes],
        }
        pos += spec.nbytes
    header.update(sorted(entries.items()))
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


class ShardWriter:
    """Stream the tensors of one `ShardPlan` into the safetensors file at `path`.

    Usage: `w = ShardWriter(path, plan, metadata)`, then `w.write(name, t)` for
    every tensor in plan order, then `w.close()`. As a context manager it
    closes on success and just releases the file on error (the partial file
    is left for the enclosing `atomic_output_dir` to discard).
    """

    def __init__(self, path: str | os.PathLike, plan: ShardPlan, metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.plan = plan
        self._next = 0  # index in plan.specs of the next tensor to write
        self._sha = hashlib.sha256()
        self._size = 0
        header = encode_header(plan, metadata)
        try:
            # O_DIRECT where the file system allows it; the file hashes what it writes, in order
            self._file = OutputFile(self.path, hasher=self._sha)
        except OSError as e:
            raise write_error(self.path, e, "create") from e
        self._emit(header)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append `tensor`; it must be the next planned tensor, with its dtype and shape."""
        if self._next >= len(self.plan.specs):
            raise ValueError(f"{self.path}: tensor {name!r} is not planned after the last tensor")
        spec = self.plan.specs[self._next]
        if name != spec.name:
            raise ValueError(f"{self.path}: expected tensor {spec.name!r} next, got {name!r}")
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"{self.path}: tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}, "
                f"planned {spec.dtype} {spec.shape}"
            )
        # Raw little-endian bytes, (nbytes,) uint8. Float8 and bool have 1-byte
        # elements; view(uint8) reinterprets any dtype without converting values.
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        self._emit(data)
        self._next += 1

    def close(self) -> ShardResult:
        """Check every planned tensor was written, flush to disk, and report the file."""
        if self._file.closed:
            raise ValueError(f"{self.path}: writer already closed")
        missing = [s.name for s in self.plan.specs[self._next :]]
        if missing:
            self._file.abort()
            raise ValueError(f"{self.path}: closed before writing {len(missing)} tensors, first {missing[0]!r}")
        try:
            self._file.close(fsync=True)  # the atomic rename must not publish unwritten data
        except OSError as e:
            raise write_error(self.path, e) from e
        return ShardResult(self.path, self._sha.hexdigest(), self._size)

    def abort(self) -> None:
        """Release the file without checks; the caller discards the partial file."""
        self._file.abort()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _emit(self, data: bytes | memoryview) -> None:
        try:
            self._file.write(data)
        except OSError as e:
            self.abort()
            raise write_error(self.path, e) from e
        self._size += len(data)
