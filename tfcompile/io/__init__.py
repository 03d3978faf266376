"""Checkpoint I/O: read HF safetensors checkpoints safely, write artifacts atomically.

- `open_checkpoint(dir)` -> `Checkpoint`: validated, lazy, memory-mapped reading.
- `read_header(file)`: our own safetensors header check (clear errors on corrupt files).
- `plan_shards` / `ShardWriter` / `write_index`: streaming, byte-deterministic output.
- `atomic_output_dir(out, overwrite)`: an output dir that appears whole or not at all.
- `sha256_file`, `copy_aux_files`: hashes and verbatim tokenizer/config copies.
"""

from tfcompile.io.atomic import atomic_output_dir
from tfcompile.io.aux_files import AUX_FILE_NAMES, copy_aux_files
from tfcompile.io.checkpoint import Checkpoint, open_checkpoint
from tfcompile.io.hashing import sha256_file
from tfcompile.io.safetensors_header import SafetensorsHeader, TensorInfo, read_header
from tfcompile.io.writer import ShardPlan, ShardResult, ShardWriter, TensorSpec, plan_shards, write_index

__all__ = [
    "AUX_FILE_NAMES",
    "Checkpoint",
    "SafetensorsHeader",
    "ShardPlan",
    "ShardResult",
    "ShardWriter",
    "TensorInfo",
    "TensorSpec",
    "atomic_output_dir",
    "copy_aux_files",
    "open_checkpoint",
    "plan_shards",
    "read_header",
    "sha256_file",
    "write_index",
]
