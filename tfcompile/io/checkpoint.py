"""Open a Hugging Face checkpoint directory for lazy, memory-mapped reading.

`open_checkpoint(dir)` reads config.json (as JSON only: no model code is ever
imported or run, whatever `auto_map` says), finds the safetensors files,
validates every header with our own parser, and returns a `Checkpoint` that
hands out tensors one at a time, memory-mapped from the file.

Weight files are found in this order (the order transformers uses):
1. `model.safetensors`;
2. `model.safetensors.index.json`, whose `weight_map` names the shards;
3. every other `*.safetensors` file in the directory.
Pickle checkpoints (`*.bin`, `*.pt`, `*.pth`) are refused, never unpickled.
"""

from __future__ import annotations

import difflib
import functools
import json
import mmap
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from tfcompile.io.bounded import MAX_DEPTH, json_depth, read_regular, unicode_text
from tfcompile.errors import CheckpointError
from tfcompile.io.aux_files import AUX_FILE_NAMES
from tfcompile.io.config_check import check_config_values
from tfcompile.io.dtypes import FLOAT_CODES, QUANTIZED_CODES, torch_dtype_of
from tfcompile.io.paths import INDEX_FILE, SINGLE_FILE, check_plain_name, resolve_in_dir
from tfcompile.io.safetensors_header import TensorInfo, read_header

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


class Checkpoint:
    """A validated checkpoint directory. Tensors are read lazily by name.

    Files are memory-mapped (read-only) on first use and the mappings cached;
    `release()` drops the mapped pages from this process's resident set (the
    page cache keeps them), so a streaming reader's RSS follows the tensors
    in use, not the bytes read so far. `close()` (or using the checkpoint as a
    context manager) unmaps the files.
    """

    def __init__(self, path: Path, config: dict[str, Any], infos: dict[str, TensorInfo], files: list[Path]):
        self.path = path
        self.config = config
        self.files = sorted(files)
        self._infos = dict(sorted(infos.items()))
        # what replaced tensors of the original (OverlayCheckpoint: distillation), recorded in the manifest
        self.provenance: dict[str, Any] = {}
        self._maps: dict[Path, tuple[mmap.mmap, int]] = {}  # file -> (mapping, data section start)
        self._touched: list[tuple[Path, int, int]] = []  # (file, byte offset, bytes) handed out since release()

    def names(self) -> list[str]:
        """Every tensor name, sorted."""
        return list(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._infos, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "list the tensors with Checkpoint.names()"
            raise CheckpointError(f"{self.path}: no tensor named {name!r}", hint=hint) from None

    def get_expert(self, name: str, e: int) -> torch.Tensor:
        """Expert `e` of the fused expert tensor `name` ([E, ...] -> [...]); a published source
        that decodes experts overrides it to decode only that one (tfcompile/io/sources/mxfp4.py)."""
        return self.get(name)[e]

    def get(self, name: str) -> torch.Tensor:
        """The tensor `name`, a read-only view of the memory-mapped file (no copy)."""
        info = self.info(name)
        try:
            dtype = torch_dtype_of(info.dtype)
            if info.nbytes == 0:
                return torch.empty(info.shape, dtype=dtype)
            mm, data_start = self._map(info.file)
            start = data_start + info.offsets[0]
            self._touched.append((info.file, start, info.nbytes))
            with warnings.catch_warnings():  # the mapping is read-only; we never write to it
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.frombuffer(mm, dtype=torch.uint8, count=info.nbytes, offset=start)
            if start % dtype.itemsize:  # unaligned in the file: copy rather than misread
                raw = raw.clone()
            return raw.view(dtype).reshape(info.shape)
        except (ValueError, OSError, RuntimeError) as e:
            raise CheckpointError(
                f"{info.file}: cannot read tensor {name!r} ({info.dtype} {list(info.shape)}): {e}",
                hint="the file may have changed since it was opened, or its dtype is not supported by torch",
            ) from e

    def _map(self, file: Path) -> tuple[mmap.mmap, int]:
        if file not in self._maps:
            with open(file, "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[file] = (mm, 8 + header_len)
        return self._maps[file]

    def release(self) -> None:
        """Drop the pages of tensors handed out so far from the resident set.

        Only the byte ranges `get` returned are advised (page-aligned outward),
        not whole files: advising a 4.5 GB mapping after each of ~70 jobs cost
        ~0.2 s of page-table walks. Pages of tensors still in use fault back in.
        """
        self.hand_off()()

    def hand_off(self) -> Callable[[], None]:
        """Forget the ranges handed out so far; the returned function drops their pages.

        For tensors that another thread reads later (the writer copying a tensor
        through): called once it has, their pages leave the resident set then,
        rather than now and faulting back in for good. Safe at any time: the
        mappings are read-only, so a dropped page only reads again from the file.
        """
        touched, self._touched = self._touched, []
        return functools.partial(self._drop, touched)

    def _drop(self, touched: list[tuple[Path, int, int]]) -> None:
        page = mmap.PAGESIZE
        for file, start, nbytes in touched:
            mapped = self._maps.get(file)
            if mapped is None:  # closed since (an aborted run): nothing resident
                continue
            lo = start - start % page
            hi = min(len(mapped[0]), start + nbytes)
            if hi > lo:
                mapped[0].madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def require_float(self, name: str) -> TensorInfo:
        """Info for a tensor about to be quantized; it must be BF16, F16 or F32."""
        info = self.info(name)
        if info.dtype in FLOAT_CODES:
            return info
        if info.dtype in QUANTIZED_CODES:
            hint = "the checkpoint is already quantized; start from the original BF16/F16/F32 checkpoint"
        else:
            hint = "this tensor is not a floating-point weight; exclude it from quantization"
        raise CheckpointError(
            f"{info.file}: tensor {name!r} is {info.dtype}, but quantization needs BF16, F16 or F32", hint=hint
        )

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data over all files (headers excluded)."""
        return sum(i.nbytes for i in self._infos.values())

    @property
    def largest_tensor_bytes(self) -> int:
        return max((i.nbytes for i in self._infos.values()), default=0)

    def aux_files(self) -> list[Path]:
        """Tokenizer/generation files present in the directory (sorted by name), to copy verbatim."""
        return [resolve_in_dir(self.path, n) for n in sorted(AUX_FILE_NAMES) if os.path.lexists(self.path / n)]

    def close(self) -> None:
        maps, self._maps = self._maps, {}
        self._touched.clear()
        for mm, _ in maps.values():
            try:
                mm.close()
            except BufferError:  # a tensor still views it: unmapped when that tensor dies
                pass

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, {len(self._infos)} tensors, {len(self.files)} files)"


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Validate the checkpoint directory at `path` and return a lazy `Checkpoint`."""
    model_dir = Path(path).absolute()
    if not model_dir.is_dir():
        what = "does not exist" if not model_dir.exists() else "is not a directory"
        raise CheckpointError(f"{model_dir} {what}", hint="pass the directory that holds config.json and *.safetensors")
    config = read_config(model_dir)
    files, expected = _find_weight_files(model_dir)
    infos = _collect_tensors(files)
    for name, (index_path, file) in expected.items():
        if name not in infos or infos[name].file != file:
            raise CheckpointError(
                f"{index_path}: entry {name!r} says the tensor is in {file.name}, but that file does not hold it",
                hint="the index does not match the shards; re-download the checkpoint",
            )
    return Checkpoint(model_dir, config, infos, files)


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json as a dict; it must name `architectures` and `model_type`."""
    cfg_path = model_dir / "config.json"
    if not os.path.lexists(cfg_path):
        raise CheckpointError(
            f"{model_dir} has no config.json", hint="pass a Hugging Face model directory (saved with save_pretrained)"
        )
    return read_config_file(resolve_in_dir(model_dir, "config.json"), cfg_path)


def read_config_file(path: Path, cfg_path: Path | None = None) -> dict[str, Any]:
    """A config.json file (`cfg_path`: the name errors give it) read bounded and checked as read_config does."""
    cfg_path = path if cfg_path is None else cfg_path
    config = _load_json_object(path)
    for key, kind in (("architectures", list), ("model_type", str)):
        value = config.get(key)
        if not isinstance(value, kind) or not value or (kind is list and not all(isinstance(a, str) and a
                                                                                  for a in value)):
            raise CheckpointError(
                f"{cfg_path}: missing or invalid {key!r}",
                hint='config.json needs "architectures" (a list of class names) and "model_type" (a string), '
                     "as save_pretrained writes",
            )
    check_config_values(config, cfg_path)
    return config


def _load_json_object(path: Path) -> dict[str, Any]:
    text = read_regular(path, "checkpoint file").decode("utf-8", errors="replace")  # bounded, never a FIFO
    if json_depth(text) > MAX_DEPTH:
        raise CheckpointError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels", hint="fix or re-download the file")
    try:
        obj = json.loads(text)
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: cannot read: {e}", hint="check the file is readable UTF-8") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", hint="fix or re-download the file"
        ) from e
    except ValueError as e:  # an integer literal over Python's 4300 digits
        raise CheckpointError(f"{path}: invalid JSON: {str(e)[:120]}", hint="fix or re-download the file") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}", hint="fix or re-download it")
    if not unicode_text(obj):
        raise CheckpointError(f"{path}: a string holds a lone surrogate (\\ud800...), no Unicode text",
                              hint="fix or re-download the file")
    return obj


def _find_weight_files(model_dir: Path) -> tuple[list[Path], dict[str, tuple[Path, Path]]]:
    """Weight files, plus {tensor: (index file, shard)} when an index names them."""
    if os.path.lexists(model_dir / SINGLE_FILE):
        return [resolve_in_dir(model_dir, SINGLE_FILE)], {}
    if os.path.lexists(model_dir / INDEX_FILE):
        return _read_index(model_dir)
    entries = sorted(os.listdir(model_dir))
    found = [resolve_in_dir(model_dir, n) for n in entries if n.endswith(".safetensors")]
    if found:
        return found, {}
    pickles = [n for n in entries if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise CheckpointError(
            f"{model_dir} holds only pickle weights ({', '.join(pickles)}); tfcompile does not load pickle files",
            hint="pickle files can run arbitrary code; convert the checkpoint to safetensors "
            "(e.g. load it in a trusted environment and save_pretrained(..., safe_serialization=True))",
        )
    raise CheckpointError(f"{model_dir} has no *.safetensors weights", hint="pass a model directory with its weights")


def _read_index(model_dir: Path) -> tuple[list[Path], dict[str, tuple[Path, Path]]]:
    index_path = resolve_in_dir(model_dir, INDEX_FILE)
    weight_map = _load_json_object(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f'{index_path}: missing or empty "weight_map"', hint="the index must map tensor names to shard files"
        )
    shard_of: dict[str, Path] = {}  # shard name -> checked path
    expected: dict[str, tuple[Path, Path]] = {}
    for tensor, shard in sorted(weight_map.items()):
        shard = check_plain_name(shard, source=index_path, entry=tensor)
        if shard not in shard_of:
            shard_of[shard] = resolve_in_dir(model_dir, shard, source=index_path, entry=tensor)
        expected[tensor] = (index_path, shard_of[shard])
    return list(shard_of.values()), expected


def _collect_tensors(files: list[Path]) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for file in sorted(files):
        for name, info in read_header(file).tensors.items():
            if name in infos:
                raise CheckpointError(
                    f"tensor {name!r} appears in both {infos[name].file} and {file}",
                    hint="remove the duplicate or stale shard from the model directory",
                )
            infos[name] = info
    return infos
