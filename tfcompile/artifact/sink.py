"""A sink that takes tensors in planned order and rolls over shard files."""

from __future__ import annotations

from pathlib import Path

import torch

from tfcompile.io.hashing import sha256_file
from tfcompile.io.writer import ShardWriter, TensorSpec, plan_shards, write_index


class ShardSink:
    """Stream `specs` (in order) into safetensors shards under `out_dir`."""

    def __init__(self, out_dir: Path, specs: list, max_shard_bytes: int, rel: str = ""):
        self.out_dir = Path(out_dir)
        self.rel = rel  # prefix of the returned relative paths, e.g. "modelopt/"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tspecs = [TensorSpec(s.name, s.dtype, tuple(s.shape)) for s in specs]
        self.plans = plan_shards(tspecs, max_shard_bytes)
        self._shard = -1
        self._left = 0  # tensors still to write in the current shard
        self._writer: ShardWriter | None = None
        self._files: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self.bytes_written = 0  # tensor data bytes (headers excluded)

    def put(self, name: str, tensor: torch.Tensor) -> None:
        while self._left == 0:
            self._next_shard()
        self._writer.write(name, tensor)
        self.bytes_written += tensor.numel() * tensor.element_size()
        self._left -= 1

    def _next_shard(self) -> None:
        self._finish_shard()
        self._shard += 1
        if self._shard >= len(self.plans):
            raise ValueError(f"{self.out_dir}: more tensors than planned")
        plan = self.plans[self._shard]
        self._writer = ShardWriter(self.out_dir / plan.file_name, plan, {"format": "pt"})
        self._left = len(plan.specs)

    def _finish_shard(self) -> None:
        if self._writer is not None:
            res = self._writer.close()
            self._files[res.path.name] = res.sha256
            self.sizes[res.path.name] = res.size
            self._writer = None

    def close(self) -> dict[str, str]:
        """Finish every shard (and the index); returns {relative path: sha256}."""
        while self._shard < len(self.plans) - 1 or self._left:
            if self._left:
                raise ValueError(f"{self.out_dir}: closed with {self._left} tensors unwritten")
            self._next_shard()
        self._finish_shard()
        index = write_index(self.out_dir, self.plans)
        if index is not None:
            self._files[index.name] = sha256_file(index)
        return {self.rel + name: digest for name, digest in self._files.items()}
