"""Checkpoint I/O: read HF safetensors checkpoints safely, write artifacts atomically.

- `open_checkpoint(dir)` -> `Checkpoint`: validated, lazy, memory-mapped reading.
- `read_header(file)`: our own safetensors header check (clear errors on corrupt files).
- `plan_shards` / `ShardWriter` / `write_index`: streaming, byte-deterministic output.
- `atomic_output_dir(out, overwrite)`: an output dir that appears whole or not at all.
- `sha256_file`, `copy_aux_files`: hashes and verbatim tokenizer/config copies.

The names above are loaded on first use (PEP 562 `__getattr__`), not when the package is: every
`tfcompile.io.<module>` import runs this file first, and checkpoint.py and writer.py import torch,
which the CLI's start-up (`tfcompile --help`, usage errors) must not pay for (tests/cli/test_startup.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# exported name -> the submodule that defines it
_EXPORTS = {
    "atomic_output_dir": "atomic",
    "AUX_FILE_NAMES": "aux_files", "copy_aux_files": "aux_files",
    "Checkpoint": "checkpoint", "open_checkpoint": "checkpoint",
    "sha256_file": "hashing",
    "SafetensorsHeader": "safetensors_header", "TensorInfo": "safetensors_header", "read_header": "safetensors_header",
    "ShardPlan": "writer", "ShardResult": "writer", "ShardWriter": "writer", "TensorSpec": "writer",
    "plan_shards": "writer", "write_index": "writer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A submodule (`tfcompile.io.writer`) or an exported name, imported when first asked for."""
    module = _EXPORTS.get(name)
    if module is None:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
